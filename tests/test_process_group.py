"""grpo.distributed.shutdown ends the process group grpo joined, and no other."""

import socket

import torch.distributed as dist

from grpo import distributed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_env_of_one(monkeypatch) -> None:
    """The environment torchrun gives the one rank of a world of one."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("WORLD_SIZE", "1")


def test_shutdown_ends_only_the_group_init_from_env_created(tmp_path, monkeypatch):
    """A world made by someone else (an in-process vLLM engine makes one) survives shutdown;
    the one init_from_env made is destroyed by it."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert distributed.init_from_env("gloo")  # already in a group: joins nothing
        distributed.shutdown()
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()

    _torchrun_env_of_one(monkeypatch)
    assert distributed.init_from_env("gloo") and dist.is_initialized()
    distributed.shutdown()
    assert not dist.is_initialized()


def test_shutdown_frees_a_trainer_held_only_by_a_cycle_before_the_group_ends(monkeypatch):
    """A DDP wrapper freed after the group's end can hang the process (shutdown's docstring):
    one kept alive only by a reference cycle is collected while the group still exists."""
    import gc
    import weakref

    class Holder:  # stands in for a trainer whose wrapper sits in a reference cycle
        pass

    _torchrun_env_of_one(monkeypatch)
    assert distributed.init_from_env("gloo")
    gc.disable()  # so only shutdown can collect the cycle
    try:
        holder = Holder()
        holder.self = holder
        alive = weakref.ref(holder)
        del holder
        seen = []
        destroy = dist.destroy_process_group
        monkeypatch.setattr(dist, "destroy_process_group", lambda: (seen.append(alive()), destroy()))
        assert alive() is not None  # nothing has collected it yet
        distributed.shutdown()
    finally:
        gc.enable()
    assert seen == [None] and not dist.is_initialized()

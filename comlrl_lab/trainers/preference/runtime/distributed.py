"""Data parallelism over ``torch.distributed``: who this process is, item shards, gathers and gradient sums.

``torchrun --nproc_per_node=K`` starts K copies of the headless runner (or of any script that builds a trainer)
and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``; ``DistContext.from_env()`` reads
them. The trainers use it this way:

- collection and evaluation: each rank samples and scores the items ``shard`` gives it (strided, so the
  shards differ in size by at most one), then ``gather_objects`` hands every rank all results, which are put
  back into item order. Pairing, replay sampling and shuffles then run identically on every rank (same
  seed, same draws), so every rank holds the same pairs and the same training batches;
- training: each rank scores a strided slice of every batch with its loss scaled by slice / batch, and
  ``sum_gradients`` adds the gradients of all ranks, so every rank takes the step one process would take on
  the whole batch;
- only the main rank (0) writes: the store, the replay files, policy snapshots and checkpoints.

With ``WORLD_SIZE`` 1 (or unset) every helper returns at once, so single-process runs take the same code path.
This module does not launch processes (torchrun does), choose what to shard (the trainers do) or hold any
state a checkpoint would need: ranks and world size are not part of a run, so a run resumes with any K.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")

#: Elements per all-reduce bucket when gradients are summed (25M floats = 100 MB in float32).
BUCKET_NUMEL = 25_000_000


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "")
    try:
        return int(value) if value.strip() else default
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from exc


@dataclass(frozen=True)
class DistContext:
    """This process's place among the data-parallel ranks (one rank, world size 1, when not under torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DistContext:
        env = os.environ if env is None else env
        world = _env_int(env, "WORLD_SIZE", 1)
        rank = _env_int(env, "RANK", 0)
        local_rank = _env_int(env, "LOCAL_RANK", rank)
        local_world = _env_int(env, "LOCAL_WORLD_SIZE", world)
        if world < 1 or not 0 <= rank < world or not 0 <= local_rank < max(local_world, 1):
            raise ValueError(
                f"inconsistent torch.distributed environment: RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local_rank}"
            )
        return cls(rank=rank, world_size=world, local_rank=local_rank, local_world_size=max(local_world, 1))

    # ------------------------------------------------------------------------------------------- identity
    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def cuda_slice(self, cuda_count: int) -> tuple[int, int]:
        """(first GPU, number of GPUs) this rank owns on its node: an equal share of the visible GPUs.

        One process per node owns them all. With more processes than GPUs on a node, ranks share one GPU each
        (``local_rank % cuda_count``), which is slow but lets a two-rank run be tried on one GPU.
        """
        if cuda_count < 1:
            return 0, 0
        per_rank = cuda_count // self.local_world_size
        if per_rank < 1:
            return self.local_rank % cuda_count, 1
        return self.local_rank * per_rank, per_rank

    # ------------------------------------------------------------------------------------ process group
    def init_process_group(self, *, cuda_available: bool | None = None) -> None:
        """Join the process group (nccl with CUDA, gloo without) when there is more than one rank."""
        if not self.enabled:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            return
        cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
        if cuda:
            first, _ = self.cuda_slice(torch.cuda.device_count())
            torch.cuda.set_device(first)  # nccl collectives run on the rank's first GPU
        dist.init_process_group(backend="nccl" if cuda else "gloo")

    def shutdown(self) -> None:
        """Leave the process group after a last barrier.

        A gloo group still alive at interpreter exit can abort the process ("terminate called without an active
        exception") after all the work is done, so every rank tears it down explicitly.
        """
        if not self.enabled:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    @property
    def comm_device(self) -> torch.device:
        """Where collective tensors must live: the rank's first GPU for nccl, the CPU for gloo."""
        import torch.distributed as dist

        if self.enabled and dist.is_initialized() and dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _require_group(self) -> Any:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError(
                f"rank {self.rank} of {self.world_size}: torch.distributed is not initialised; "
                "call DistContext.init_process_group() (the trainers and the CLI do) before collectives."
            )
        return dist

    # ----------------------------------------------------------------------------------------- sharding
    def shard(self, values: Sequence[T]) -> list[T]:
        """This rank's strided share of ``values``: positions rank, rank + K, rank + 2K, ..."""
        return list(values[self.rank :: self.world_size]) if self.enabled else list(values)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (pickled; for records, not tensors)."""
        if not self.enabled:
            return [obj]
        dist = self._require_group()
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def gather_shards(self, local: Sequence[T]) -> list[T]:
        """Undo ``shard``: gather every rank's results for its shard and interleave them into the original order."""
        if not self.enabled:
            return list(local)
        return interleave(self.gather_objects(list(local)))

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of rank ``src`` on every rank."""
        if not self.enabled:
            return obj
        dist = self._require_group()
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            self._require_group().barrier()

    # ------------------------------------------------------------------------------------------ tensors
    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks of a short list of numbers (metric sums, counts, flags)."""
        if not self.enabled:
            return [float(v) for v in values]
        dist = self._require_group()
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.cpu().tolist()

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter], bucket_numel: int = BUCKET_NUMEL) -> None:
        """Replace every gradient by its sum over ranks (missing gradients count as zeros).

        A parameter with no gradient on any rank (one the loss never reaches, such as a reward model's unused LM
        head) keeps none, as in one process, so the optimiser leaves it alone (AdamW would otherwise decay it).
        Gradients are flattened into buckets of at most ``bucket_numel`` elements per dtype, so a model costs a
        handful of all-reduces, not one per tensor. Every rank must pass the same parameters in the same order.
        """
        if not self.enabled:
            return
        dist = self._require_group()
        params = [p for p in parameters if p.requires_grad]
        comm = self.comm_device
        present = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=comm)
        dist.all_reduce(present, op=dist.ReduceOp.SUM)
        params = [p for p, count in zip(params, present.tolist()) if count > 0]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in params:
            by_dtype.setdefault(p.grad.dtype, []).append(p)
        for group in by_dtype.values():
            for bucket in _buckets(group, bucket_numel):
                flat = torch.cat([p.grad.reshape(-1).to(comm) for p in bucket])
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                offset = 0
                for p in bucket:
                    n = p.grad.numel()
                    p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                    offset += n

    def broadcast_parameters(self, tensors: Iterable[torch.Tensor], src: int = 0) -> None:
        """Make every rank's ``tensors`` (e.g. a model's trainable parameters) equal to rank ``src``'s."""
        if not self.enabled:
            return
        dist = self._require_group()
        comm = self.comm_device
        with torch.no_grad():
            for tensor in tensors:
                moved = tensor.data.to(comm)
                dist.broadcast(moved, src=src)
                if moved is not tensor.data:
                    tensor.data.copy_(moved)


def interleave(shards: Sequence[Sequence[T]]) -> list[T]:
    """The inverse of strided sharding: position p comes from shard p % K at index p // K."""
    out: list[T] = []
    longest = max((len(s) for s in shards), default=0)
    for index in range(longest):
        for shard in shards:
            if index < len(shard):
                out.append(shard[index])
    return out


def _buckets(params: list[torch.nn.Parameter], limit: int) -> Iterable[list[torch.nn.Parameter]]:
    bucket: list[torch.nn.Parameter] = []
    size = 0
    for p in params:
        if bucket and size + p.numel() > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append(p)
        size += p.numel()
    if bucket:
        yield bucket

"""Which queues each figure serves: the sweeps of Figures 1-3, at full size or quick.

A sweep is a list of points, each a workload spec and a batch size. A spec seeds its own
random generator from the run's seed, the trial and the spec's shape (not `rho`), so every
order at a point serves the very same queue, a batch-size sweep serves one queue at every
size, and a `rho` sweep keeps prompts and draws fixed while only the correlation moves.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from inference_auctions.experiments.workloads import (
    OUTPUT_TOKENS,
    Workload,
    chains,
    check_output_tokens,
    load_workload,
    mixshare,
    one_cluster_bids,
    trees,
)

__all__ = ["FULL", "QUICK", "Point", "Scale", "Sweep", "WorkloadSpec", "figure_sweeps"]

KINDS = ("mixshare", "chains", "trees-short", "trees-long", "one-cluster", "file")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """How to build a queue: a generator kind and its parameters, or a workload file.

    `outputs` is the range the queries' output lengths are drawn from.
    """

    kind: str
    share: float = 50.0
    rho: float = 0.0
    path: str = ""
    outputs: tuple[int, int] = OUTPUT_TOKENS

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown workload kind {self.kind!r}; choose from {KINDS}")
        check_output_tokens(self.outputs)

    @property
    def label(self) -> str:
        """A short name for tables and plots."""
        if self.kind == "mixshare":
            return f"mixshare-{self.share:g}"
        if self.kind == "file":
            return Path(self.path).stem
        return self.kind

    def make(self, queue: int, seed: int, trial: int) -> Workload:
        """The queue of this spec for `trial` (a file gives its own queue, whatever `queue`)."""
        key = [seed, trial, zlib.crc32(self.kind.encode()), round(self.share * 1000)]
        rng = np.random.default_rng(key)
        outputs = self.outputs
        if self.kind == "mixshare":
            return mixshare(self.share, queue, rng, rho=self.rho, outputs=outputs)
        if self.kind == "chains":
            return chains(queue, rng, rho=self.rho, outputs=outputs)
        if self.kind in ("trees-short", "trees-long"):
            variant = self.kind.removeprefix("trees-")
            return trees(variant, queue, rng, rho=self.rho, outputs=outputs)
        if self.kind == "one-cluster":
            return one_cluster_bids(queue, rng, outputs=outputs)
        return load_workload(Path(self.path), rng, outputs=outputs)


@dataclass(frozen=True, slots=True)
class Point:
    """One x position of a sweep: the queue to serve and the batch size to auction it in."""

    x: float | str
    workload: WorkloadSpec
    batch: int


@dataclass(frozen=True, slots=True)
class Sweep:
    """One column of a figure: a varying parameter and the points that vary it."""

    key: str
    title: str
    x_label: str
    queue: int
    points: tuple[Point, ...]

    @property
    def categorical(self) -> bool:
        """Whether the x values are names (bars) rather than numbers (lines)."""
        return any(isinstance(point.x, str) for point in self.points)


@dataclass(frozen=True, slots=True)
class Scale:
    """The grid of a run: queue size, the values each sweep visits, the autobidding horizon."""

    queue: int
    batches: tuple[int, ...]
    shares: tuple[float, ...]
    rhos: tuple[float, ...]
    share_batch: int
    auctions: int


FULL = Scale(
    queue=1024,
    batches=(32, 64, 128, 256, 512, 1024),
    shares=(0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100),
    rhos=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    share_batch=256,
    auctions=60,
)
# A smoke-sized run: half the queue (still far beyond the cache, except short trees), two or
# three points a sweep and a shorter horizon.
QUICK = Scale(
    queue=512,
    batches=(32, 128, 512),
    shares=(0, 50, 100),
    rhos=(0.0, 1.0),
    share_batch=128,
    auctions=20,
)


def figure_sweeps(
    figure: str,
    scale: Scale,
    workload_file: Path | None = None,
    outputs: tuple[int, int] = OUTPUT_TOKENS,
) -> list[Sweep]:
    """The sweeps behind `figure` ("figure1", "figure2" or "figure3"), with output lengths.

    Each spec validates `outputs` itself when `replace` builds it.
    """
    return [
        replace(
            sweep,
            points=tuple(
                replace(point, workload=replace(point.workload, outputs=outputs))
                for point in sweep.points
            ),
        )
        for sweep in _sweeps(figure, scale, workload_file)
    ]


def _sweeps(figure: str, scale: Scale, workload_file: Path | None) -> list[Sweep]:
    q = scale.queue
    if workload_file is not None:
        return _file_sweeps(figure, workload_file, scale)
    star = WorkloadSpec("mixshare", share=50.0)
    if figure == "figure1":
        return [
            _batch_sweep("batch", "mixshare-50: batch size", star, scale),
            Sweep(
                "share",
                f"sharing fraction (n={scale.share_batch})",
                "P (% of queries sharing a prefix)",
                q,
                tuple(
                    Point(p, WorkloadSpec("mixshare", share=p), scale.share_batch)
                    for p in scale.shares
                ),
            ),
            Sweep(
                "rho",
                f"value correlation (n={q})",
                "rho (within-cluster correlation)",
                q,
                tuple(Point(r, WorkloadSpec("mixshare", share=50.0, rho=r), q) for r in scale.rhos),
            ),
        ]
    if figure == "figure2":
        kinds = (
            star,
            WorkloadSpec("chains"),
            WorkloadSpec("trees-short"),
            WorkloadSpec("trees-long"),
        )
        names = ("stars", "chains", "short trees", "long trees")
        return [
            Sweep(
                "topology",
                f"tree topologies (n=Q={q})",
                "topology",
                q,
                tuple(Point(name, spec, q) for name, spec in zip(names, kinds, strict=True)),
            )
        ]
    if figure == "figure3":
        return [_batch_sweep("one-cluster", "one cluster bids", WorkloadSpec("one-cluster"), scale)]
    raise ValueError(f"no sweeps for {figure!r}")


def _batch_sweep(key: str, title: str, spec: WorkloadSpec, scale: Scale) -> Sweep:
    points = tuple(Point(n, spec, n) for n in scale.batches if n <= scale.queue)
    return Sweep(key, title, "batch size n", scale.queue, points)


def _file_sweeps(figure: str, path: Path, scale: Scale) -> list[Sweep]:
    """A user's queue: batch sizes up to its length (figure1) or the whole queue (figure2)."""
    spec = WorkloadSpec("file", path=str(path))
    queue = len(spec.make(scale.queue, 0, 0))
    if figure == "figure1":
        sizes = sorted({n for n in scale.batches if n < queue} | {queue})
        points = tuple(Point(n, spec, n) for n in sizes)
        return [Sweep("batch", f"{spec.label}: batch size", "batch size n", queue, points)]
    if figure == "figure2":
        point = Point(spec.label, spec, queue)
        return [Sweep("topology", f"{spec.label} (n=Q={queue})", "workload", queue, (point,))]
    raise ValueError(
        f"{figure} needs the synthetic workloads; a workload file runs figure1 and figure2"
    )

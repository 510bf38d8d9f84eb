"""Write a run down: `results.json` with every number, `results.md` with the tables."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inference_auctions.experiments.autobidding import AutobidRun
from inference_auctions.experiments.figures import METRICS
from inference_auctions.experiments.headlines import Headline, headlines
from inference_auctions.experiments.metrics import mean_and_stderr
from inference_auctions.experiments.runner import SweepResult

__all__ = ["Results", "machine", "write_report"]


@dataclass(slots=True)
class Results:
    """Everything one run measured, with the settings that produced it."""

    settings: dict[str, Any]
    sweeps: dict[str, list[SweepResult]] = field(default_factory=dict)
    autobidding: dict[str, list[AutobidRun]] = field(default_factory=dict)
    elapsed: dict[str, float] = field(default_factory=dict)

    def headlines(self) -> list[Headline]:
        """The paper's headline numbers next to this run's."""
        return headlines(self.sweeps, self.autobidding)


def machine() -> dict[str, Any]:
    """The CPU model, core count and Python that ran the experiments."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "system": platform.platform(),
    }


def write_report(results: Results, out: Path) -> tuple[Path, Path]:
    """Write `results.json` and `results.md` into `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = out / "results.json", out / "results.md"
    json_path.write_text(json.dumps(to_json(results), indent=1) + "\n", encoding="utf-8")
    markdown_path.write_text(to_markdown(results), encoding="utf-8")
    return json_path, markdown_path


def to_json(results: Results) -> dict[str, Any]:
    """Every measured number: per trial, and as mean with one standard error."""
    return {
        "settings": results.settings,
        "elapsed_seconds": results.elapsed,
        "headlines": [asdict(h) for h in results.headlines()],
        "figures": {
            **{name: [_sweep_json(r) for r in sweeps] for name, sweeps in results.sweeps.items()},
            **(
                {
                    "figure4": {
                        v: [_autobid_json(r) for r in runs]
                        for v, runs in results.autobidding.items()
                    }
                }
                if results.autobidding
                else {}
            ),
        },
    }


def _sweep_json(result: SweepResult) -> dict[str, Any]:
    sweep = result.sweep
    points = []
    for i, point in enumerate(sweep.points):
        shapes = result.workloads[i]
        orders = {}
        for order, per_point in result.measurements.items():
            trials = per_point[i]
            orders[order] = {
                name: _stat([float(getattr(m, name)) for m in trials])
                for name in (
                    "welfare_percent",
                    "welfare",
                    "hit_rate",
                    "mean_ttft",
                    "drain",
                    "evicted_tokens",
                    "value_weighted_ttft",
                    "held",
                )
            }
        points.append(
            {
                "x": point.x,
                "batch": point.batch,
                "workload": point.workload.label,
                "rho": point.workload.rho,
                "mean_prompt_tokens": _stat([s.mean_prompt_tokens for s in shapes]),
                "shared_percent": _stat([s.shared_percent for s in shapes]),
                "unique_tokens": _stat([float(s.unique_tokens) for s in shapes]),
                "orders": orders,
            }
        )
    return {
        "key": sweep.key,
        "title": sweep.title,
        "x_label": sweep.x_label,
        "queue": sweep.queue,
        "points": points,
    }


def _autobid_json(run: AutobidRun) -> dict[str, Any]:
    return {
        "welfare_ratio": run.welfare_ratio,
        "bound_margin": run.bound_margin,
        "truthful_welfare": run.truthful,
        "paced_welfare": run.paced,
        "bound": run.bound,
        "kappa": [k if k != float("inf") else None for k in run.kappa],
        "truthful_welfare_percent": run.truthful_percent,
        "paced_welfare_percent": run.paced_percent,
        "budgets_micros": run.budgets,
        "alpha": run.alphas,
        "cumulative_spend_micros": run.spend,
    }


def _stat(samples: list[float]) -> dict[str, Any]:
    mean, error = mean_and_stderr(samples)
    return {"mean": mean, "se": error, "trials": samples}


def to_markdown(results: Results) -> str:
    """The headline comparison and one table per sweep, as GitHub markdown."""
    settings = results.settings
    lines = [
        "# Experiment results",
        "",
        f"Queue Q = {settings['queue']}, {settings['trials']} trials, seed {settings['seed']}, "
        f"cache {settings['cache_tokens']:,} tokens, "
        f"outputs {_range(settings['output_tokens'])} tokens, "
        f"{_deferral(settings.get('deferral'))}. "
        f"Machine: {settings['machine']['cpu']}, {settings['machine']['cores']} cores. "
        f"Wall time: {sum(results.elapsed.values()):.0f} s "
        f"({', '.join(f'{k} {v:.0f} s' for k, v in results.elapsed.items())}).",
        "",
        "Means over trials ± one standard error.",
        "",
        "## Headline numbers: paper vs this run",
        "",
        "| figure | claim | paper | ours |",
        "|---|---|---|---|",
    ]
    lines += [f"| {h.figure} | {h.claim} | {h.paper} | {h.ours} |" for h in results.headlines()]
    for name, sweeps in results.sweeps.items():
        for result in sweeps:
            lines += [
                "",
                f"## {name.capitalize()}: {result.sweep.title}",
                "",
                *_sweep_table(result),
            ]
    if results.autobidding:
        lines += ["", "## Figure4: autobidding", "", *_autobid_table(results.autobidding)]
    return "\n".join(lines) + "\n"


def _sweep_table(result: SweepResult) -> list[str]:
    header = f"| {result.sweep.x_label} | order | " + " | ".join(label for _, label, _ in METRICS)
    lines = [
        header + " | value-weighted TTFT, s | last first token, s | held back | shared tokens, % |",
        "|---" * (len(METRICS) + 6) + "|",
    ]
    for i, point in enumerate(result.sweep.points):
        shared = mean_and_stderr([s.shared_percent for s in result.workloads[i]])[0]
        for order, per_point in result.measurements.items():
            trials = per_point[i]
            cells = [
                _cell([scale * float(getattr(m, name)) for m in trials])
                for name, _, scale in METRICS
            ]
            weighted = _cell([m.value_weighted_ttft for m in trials])
            drain = _cell([m.drain for m in trials])
            held = _cell([float(m.held) for m in trials])
            lines.append(
                f"| {point.x} | {order} | {' | '.join(cells)} | {weighted} | {drain} | {held} "
                f"| {shared:.0f} |"
            )
    return lines


def _autobid_table(runs: dict[str, list[AutobidRun]]) -> list[str]:
    lines = [
        "| trees | paced / truthful welfare | truthful, % above ½Σv | paced, % above ½Σv "
        "| auctions at or above bound | smallest welfare / bound | median max κ |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant, trials in runs.items():
        ratio = _cell([100.0 * r.welfare_ratio for r in trials], suffix="%")
        truthful = _cell([sum(r.truthful_percent) / len(r.truthful_percent) for r in trials])
        paced = _cell([sum(r.paced_percent) / len(r.paced_percent) for r in trials])
        held = sum(p >= b for r in trials for p, b in zip(r.paced, r.bound, strict=True))
        total = sum(len(r.paced) for r in trials)
        margin = min(r.bound_margin for r in trials)
        kappas = sorted(k for r in trials for k in r.kappa)
        lines.append(
            f"| {variant} | {ratio} | {truthful} | {paced} | {held}/{total} | {margin:.3f} "
            f"| {kappas[len(kappas) // 2]:.2f} |"
        )
    return lines


def _cell(samples: list[float], suffix: str = "") -> str:
    mean, error = mean_and_stderr(samples)
    digits = 0 if abs(mean) >= 100 else 1 if abs(mean) >= 10 else 2
    return f"{mean:.{digits}f}{suffix} ± {error:.{digits}f}"


def _deferral(deferral: dict[str, Any] | None) -> str:
    if deferral is None:
        return "in-step prefix deferral off"
    return (
        f"in-step prefix deferral on (K = {deferral['threshold_tokens']} tokens, "
        f"holds of at most {deferral['max_hold_seconds']:g} s)"
    )


def _range(bounds: list[int]) -> str:
    low, high = bounds
    return str(low) if low == high else f"{low}-{high}"

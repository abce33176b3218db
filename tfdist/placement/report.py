"""What a placed model looks like: layers by device, weights, traffic and time per stage."""

from __future__ import annotations

import dataclasses

from tfdist.placement import plan as plan_lib

__all__ = ["PlacementReport"]


@dataclasses.dataclass(frozen=True)
class PlacementReport:
    """A placement plan with the numbers measured on its devices.

    `str(report)` is a table; the fields are there for programs.

    Attributes:
      model_name: The placed model's name.
      plan: The stages and their devices.
      num_microbatches: Microbatches per step and pipeline (M).
      microbatch_rows: Rows of the microbatch the per-microbatch numbers
        (activation bytes, FLOPs, times) are for.
      stage_times_s: Per stage, seconds of one forward and backward pass of
        its layers on one microbatch, timed on the stage's device; None if
        not measured.
      rematerialized: Names of the layers whose activations are recomputed
        in the backward pass.
      pipelines: The copies of the pipeline (pipeline x data parallelism),
        each its devices in stage order; the plan's devices are the
        first's. Empty: the plan's devices alone.
    """

    model_name: str
    plan: plan_lib.PlacementPlan
    num_microbatches: int
    microbatch_rows: int = 1
    stage_times_s: tuple[float, ...] | None = None
    rematerialized: tuple[str, ...] = ()
    pipelines: tuple[tuple[str, ...], ...] = ()

    @property
    def bubble_fraction(self) -> float:
        """Idle share of each stage in GPipe's schedule, (S − 1) / (M + S − 1)."""
        return plan_lib.bubble_fraction(self.plan.num_stages, self.num_microbatches)

    @property
    def measured_balance(self) -> float | None:
        """Mean over max of the measured stage times (1.0 is perfectly even)."""
        if not self.stage_times_s or max(self.stage_times_s) <= 0:
            return None
        times = self.stage_times_s
        return sum(times) / len(times) / max(times)

    def __str__(self) -> str:
        plan = self.plan
        header = (
            f"Placement of model {self.model_name!r}: {plan.num_stages} stage(s), "
            f"balance_by={plan.balance_by!r}, num_microbatches="
            f"{self.num_microbatches} (GPipe bubble "
            f"{100 * self.bubble_fraction:.0f}% of each stage's step); "
            f"per-microbatch numbers for {self.microbatch_rows} row(s)"
        )
        columns = ("stage", "device", "layers", "params", "weights", "out/microbatch",
                   f"cost ({plan.balance_by})", "measured")
        rows = []
        for stage in plan.stages:
            measured = (
                f"{1e3 * self.stage_times_s[stage.index]:.2f} ms"
                if self.stage_times_s is not None
                else "-"
            )
            rows.append((
                str(stage.index),
                stage.device,
                str(len(stage.layers)),
                f"{stage.params:,}",
                _bytes(stage.param_bytes),
                _bytes(stage.output_bytes) if stage.index < plan.num_stages - 1 else "-",
                f"{stage.cost:.4g}",
                measured,
            ))
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        lines = [header, "  ".join(c.ljust(w) for c, w in zip(columns, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in rows]
        if self.measured_balance is not None:
            lines.append(f"measured balance (mean/max stage time): {self.measured_balance:.2f}")
        if len(self.pipelines) > 1:
            lines.append(
                f"{len(self.pipelines)} copies of the pipeline (data parallel), stage devices: "
                + "; ".join(", ".join(p) for p in self.pipelines)
            )
        if plan.idle_devices:
            lines.append(
                f"idle devices (more devices than layers): {', '.join(plan.idle_devices)}"
            )
        lines.append("layer -> device:")
        name_width = max(len(n) for s in plan.stages for n in s.layers)
        remat = set(self.rematerialized)
        for stage in plan.stages:
            for name in stage.layers:
                note = "  (rematerialized)" if name in remat else ""
                lines.append(f"  {name.ljust(name_width)}  {stage.device}  stage {stage.index}{note}")
        return "\n".join(lines)


def _bytes(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"

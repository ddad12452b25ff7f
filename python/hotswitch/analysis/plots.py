"""Pictures of a step plan (matplotlib, Agg backend: no display needed)."""

from typing import List, Optional

from hotswitch import _C
from hotswitch.analysis.simulate import switch_share

__all__ = ["plot_metrics", "plot_predicted_measured", "plot_step"]


def plot_step(plan: "_C.StepPlan", planner: "_C.Planner", path: str, title: Optional[str] = None) -> None:
    """Draws one step plan to the PNG file ``path``.

    Top: the histogram of the step's piece lengths (tokens, log scale), each phase's length
    range shaded in its layout's colour. Bottom: the step's timeline in predicted seconds:
    parameter switches (grey), each phase's run (its colour) and its gradients into the home
    layout (hatched), against the best static layout's run below. ValueError when the file
    cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    pieces = plan.pieces
    lengths = [p.length for p in pieces]
    names = sorted({ph.layout.name for ph in plan.phases} |
                   {planner.candidates[plan.best_static_candidate].name})
    palette = plt.get_cmap("tab10")
    colour = {n: palette(i % 10) for i, n in enumerate(names)}

    fig, (hist, line) = plt.subplots(2, 1, figsize=(10, 6.5), gridspec_kw={"height_ratios": [3, 2]})
    lo, hi = max(1, min(lengths)), max(lengths)
    bins = [lo * (hi / lo) ** (k / 40) for k in range(41)] if hi > lo else [lo * 0.9, hi * 1.1]
    hist.hist(lengths, bins=bins, color="0.35", zorder=3)
    hist.set_xscale("log")
    for ph in plan.phases:
        ls = [lengths[i] for i in ph.sequences]
        hist.axvspan(min(ls), max(ls), color=colour[ph.layout.name], alpha=0.3, zorder=1)
        hist.axvline(max(ls), color=colour[ph.layout.name], lw=1.5, zorder=2)
    hist.set_xlabel("piece length (tokens)")
    hist.set_ylabel("pieces")
    hist.legend(handles=[Patch(color=colour[ph.layout.name], alpha=0.5,
                               label=f"{ph.layout.name}: {len(ph.sequences)} pieces")
                         for ph in plan.phases], loc="upper right")
    hist.set_title(title or f"{len(lengths)} pieces, {len(plan.phases)} phases, predicted "
                            f"{plan.total_seconds:.2f} s vs best static {plan.best_static_seconds:.2f} s")

    t = 0.0
    for ph in plan.phases:
        name = ph.layout.name
        if ph.switch_in_seconds > 0:
            line.barh(1, ph.switch_in_seconds, left=t, color="0.6", edgecolor="black")
            t += ph.switch_in_seconds
        line.barh(1, ph.cost.run_seconds, left=t, color=colour[name], edgecolor="black")
        line.text(t + ph.cost.run_seconds / 2, 1, name, ha="center", va="center", fontsize=8)
        t += ph.cost.run_seconds
        if ph.grad_seconds > 0:
            line.barh(1, ph.grad_seconds, left=t, color=colour[name], hatch="//", edgecolor="black", alpha=0.6)
            t += ph.grad_seconds
    if plan.switch_back_seconds > 0:
        line.barh(1, plan.switch_back_seconds, left=t, color="0.6", edgecolor="black")
    static = planner.candidates[plan.best_static_candidate].name
    line.barh(0, plan.best_static_seconds, color=colour[static], edgecolor="black")
    line.text(plan.best_static_seconds / 2, 0, static, ha="center", va="center", fontsize=8)
    line.set_yticks([0, 1])
    line.set_yticklabels(["best static", "hot switching"])
    line.set_xlabel("predicted seconds")
    line.legend(handles=[Patch(color="0.6", label="parameter switch"),
                         Patch(facecolor="white", hatch="//", edgecolor="black", label="gradients home")],
                loc="lower right")
    line.set_xlim(0, 1.02 * max(plan.total_seconds, plan.best_static_seconds))
    line.set_title(f"timeline: {switch_share(plan, planner):.3f} s of switching (grey, hatched)", fontsize=10)
    _save(fig, path)


def plot_metrics(records: List[dict], path: str, title: Optional[str] = None) -> None:
    """Draws a training run's metrics (the objects of ``--metrics-file``, one per logged
    iteration) to the PNG file ``path``: the loss, the throughput (tokens/s) and the share of
    each layout among the logged iterations' phases, against the iteration. ValueError when
    the records lack a field or the file cannot be written."""
    if not records:
        raise ValueError("no metrics records to plot")
    for i, r in enumerate(records):
        for key in ("iteration", "lm_loss", "tokens_per_s", "layouts"):
            if key not in r:
                raise ValueError(f"metrics record {i} has no {key!r} (fields: {sorted(r)})")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [r["iteration"] for r in records]
    names = sorted({l for r in records for l in r["layouts"]})
    fig, (loss, speed, share) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    loss.plot(its, [r["lm_loss"] for r in records], marker=".")
    loss.set_ylabel("lm loss")
    speed.plot(its, [r["tokens_per_s"] for r in records], marker=".", color="tab:green")
    speed.set_ylabel("tokens / s")
    bottom = [0.0] * len(records)
    for name in names:
        part = [r["layouts"].count(name) / max(1, len(r["layouts"])) for r in records]
        share.bar(its, part, bottom=bottom, label=name)
        bottom = [b + p for b, p in zip(bottom, part)]
    share.set_ylabel("share of phases")
    share.set_xlabel("iteration")
    share.legend(loc="upper right", fontsize=8)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def _save(fig, path: str) -> None:
    """Writes ``fig`` to the PNG file ``path`` and closes it; ValueError when it cannot."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise ValueError(f"cannot write plot {path!r}: {e.strerror}") from None
    finally:
        plt.close(fig)


def plot_predicted_measured(labels, predicted_s, measured_s, path: str, title: Optional[str] = None,
                            groups=None) -> None:
    """Draws predicted against measured seconds, log-log, to the PNG file ``path``.

    One point per run (``labels`` name them, ``groups`` colour them: e.g. "gpt packed"), the
    diagonal and a band of +-15% around it. ValueError when the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not (len(labels) == len(predicted_s) == len(measured_s)) or not len(labels):
        raise ValueError(f"labels, predicted_s and measured_s must be equally long and non-empty, got "
                         f"{len(labels)}, {len(predicted_s)}, {len(measured_s)}")
    groups = list(groups) if groups is not None else ["runs"] * len(labels)
    fig, ax = plt.subplots(figsize=(5.5, 5), dpi=100)
    lo = min(min(predicted_s), min(measured_s)) / 1.3
    hi = max(max(predicted_s), max(measured_s)) * 1.3
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    ax.fill_between([lo, hi], [lo / 1.15, hi / 1.15], [lo * 1.15, hi * 1.15], color="0.85", zorder=0,
                    label="\u00b115%")
    palette = plt.get_cmap("tab10")
    for k, g in enumerate(sorted(set(groups))):
        xs = [m for m, gg in zip(measured_s, groups) if gg == g]
        ys = [p for p, gg in zip(predicted_s, groups) if gg == g]
        ax.scatter(xs, ys, s=14, color=palette(k % 10), label=g, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured iteration (s)")
    ax.set_ylabel("predicted iteration (s)")
    ax.set_title(title or f"{len(labels)} runs", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    _save(fig, path)

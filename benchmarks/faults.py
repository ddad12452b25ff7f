"""Fault scenarios on real gloo processes, a resume after a kill, and the bad-input tables.

Scenarios (4 ranks, rank 1 the victim, runtime timeout 8 s): a rank killed during a
parameter switch, during a phase (in the middle of its micro-batches), during a checkpoint
save; a rank stalling past the timeout during a switch and during a phase; a rank whose batch
differs from the others'. For each, every survivor must raise (a fault type, or ValueError
for the differing batch) within the timeout plus scheduling slack, keep its last complete
state (master weights and step; the latest checkpoint still the last complete one), and a
restarted job must resume from the last checkpoint and reach the same weights, bit for bit,
as a run that never failed. A scenario that crashes or hangs counts as failed: its survivors'
state as lost and the resume as not equal. ``--quick`` leaves out the stall during a phase.

Bad inputs (``tests/python/bad_inputs.py``): each must raise ValueError naming the value, or,
for a command-line argument, exit with code 2 and a message naming the value and the option.

    .venv/bin/python -m benchmarks.faults [--quick]
"""

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time

import numpy as np

from hotswitch.testing import bad_inputs
from hotswitch.testing import scenarios as fw
from hotswitch.testing.harness import run_world

TIMEOUT = 8.0
SLACK = 20.0
SCENARIOS = [("switch", "kill"), ("phase", "kill"), ("save", "kill"), ("switch", "stall"), ("phase", "stall")]


def differing_batch(rank, world):
    rt = fw.fault_runtime(TIMEOUT)
    before = fw.snapshot(rt)
    start = time.monotonic()
    try:
        rt.train_step(fw.batch([5, 9, 40], seed=rank))
    except ValueError as e:
        return {"type": type(e).__name__, "message": str(e), "elapsed": time.monotonic() - start,
                "state_kept": fw.same_weights(before, rt.master) and rt.step == 0}
    return {"type": None, "message": "", "elapsed": time.monotonic() - start, "state_kept": False}


def _options(name):
    """The command-line options a bad-input case's name mentions (``"train --lr nan"``)."""
    return [word for word in name.split() if word.startswith("--")]


def refusal_problem(name, call, needle):
    """None when ``call`` refused its input naming ``needle``: a ValueError whose message names
    it, or an argparse exit (code 2) whose error message on stderr (not the usage) names it
    and every option the case's name mentions. Otherwise why not."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            call()
    except ValueError as e:
        return None if needle in str(e) else f"message {str(e)!r} does not name {needle!r}"
    except SystemExit as e:
        if e.code != 2:
            return f"exit code {e.code}, expected 2"
        # argparse prints its usage, which names every option, then "PROG: error: MESSAGE".
        printed = stderr.getvalue()
        message = printed[printed.find(": error: "):] if ": error: " in printed else printed
        missing = [w for w in [needle, *_options(name)] if w not in message]
        if missing:
            return f"exit 2 with message {message.strip()[-200:]!r}, which does not name {missing}"
        return None
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__}: {e}"
    return "accepted"


def _resumed_equal(root, reference):
    """Whether a job restarted from ``root`` reaches the uninterrupted run's step and weights,
    bit for bit (a resume that fails, or returns no weights, is not equal)."""
    try:
        weights, step = run_world(4, fw.resume, root, timeout=300)[0]
    except AssertionError as e:
        return False, f"resume failed: {str(e)[:160]}"
    if not weights or weights.keys() != reference[0].keys():
        return False, f"resume returned tensors {sorted(weights or {})[:4]}, expected {len(reference[0])} tensors"
    if step != reference[1]:
        return False, f"resume reached step {step}, expected {reference[1]}"
    differ = [k for k in weights if not np.array_equal(weights[k], reference[0][k])]
    return not differ, f"{len(differ)} tensors differ" if differ else ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="kills and the stall during a switch, no stall during a phase (about two minutes)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    scenarios = [s for s in SCENARIOS if s != ("phase", "stall")] if args.quick else SCENARIOS
    reference = run_world(4, fw.uninterrupted, timeout=300)[0]
    survivors_per_scenario = 4 - 1
    rows, raised, hangs, failed, lost, resumed, resumed_equal = [], 0, 0, 0, 0, 0, True
    for stage, action in scenarios:
        name = f"{action} during {stage}"
        with tempfile.TemporaryDirectory() as root:
            try:
                out = run_world(4, fw.scenario, root, stage, action, TIMEOUT, allow_exit=(fw.VICTIM,),
                                timeout=6 * TIMEOUT + 120)
            except AssertionError as e:  # a rank still running past the deadline, or a crash
                # Nothing is known of the survivors' state, and no resume can be judged.
                hangs += "still running" in str(e)
                failed += 1
                lost += survivors_per_scenario
                resumed_equal = False
                rows.append((name, "FAILED", str(e)[:200]))
                continue
            survivors = [r for i, r in enumerate(out) if i != fw.VICTIM]
            ok = all(r["type"] in ("SwitchFault", "SwitchTimeout") and r["elapsed"] <= TIMEOUT + SLACK
                     for r in survivors)
            raised += ok
            lost += sum(not (r["state_kept"] and r["latest"] == r["first"]) for r in survivors)
            equal, why = _resumed_equal(root, reference)
            resumed += 1
            resumed_equal &= equal
            slowest = max(r["elapsed"] for r in survivors)
            note = "" if equal else f" [resume not equal: {why}]"
            rows.append((name, f"{slowest:.1f} s", survivors[0]["message"][:160] + note))
    try:
        out = run_world(4, differing_batch, timeout=300)
    except AssertionError as e:
        failed += 1
        lost += 4
        rows.append(("differing batch", "FAILED", str(e)[:200]))
    else:
        ok = all(r["type"] == "ValueError" and r["elapsed"] <= TIMEOUT + SLACK for r in out)
        raised += ok
        lost += sum(not r["state_kept"] for r in out)
        rows.append(("differing batch", f"{max(r['elapsed'] for r in out):.1f} s", out[0]["message"][:160]))

    tried = 0
    failures = []
    for name, call, needle in bad_inputs.LOCAL:
        tried += 1
        problem = refusal_problem(name, call, needle)
        if problem:
            failures.append((name, problem))
    cases, unchanged, _ = run_world(1, bad_inputs.runtime_table, timeout=300)[0]
    tried += len(cases)
    failures += [(n, p) for n, p in cases if p is not None]
    if not unchanged:
        failures.append(("runtime state", "changed by refused calls"))

    print(f"{'scenario':<22}{'slowest survivor':>18}  first survivor's error")
    for name, elapsed, message in rows:
        print(f"{name:<22}{elapsed:>18}  {message}")
    print(f"bad inputs: {tried} tried, {len(failures)} not refused as expected {failures[:5]}")
    result = {
        "scenarios": len(scenarios) + 1,
        "stall_scenarios": sum(action == "stall" for _, action in scenarios),
        "raised_within_timeout": raised,
        "scenarios_failed": failed,
        "hangs": hangs,
        "state_lost": lost,
        "resumes": resumed,
        "resume_bitwise_equal": bool(resumed_equal and resumed > 0),
        "bad_inputs_tried": tried,
        "bad_inputs_refused": tried - len(failures),
        "timeout_s": TIMEOUT,
        "seconds": round(time.monotonic() - start, 1),
    }
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Measure a trained version for a gate policy's ``measured`` list, and show every floor's margin in stderrs.

    .venv/bin/python scripts/calibrate_gate.py --home /tmp/run-home chat 1
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python scripts/calibrate_gate.py --home ... chat 1
    .venv/bin/python scripts/calibrate_gate.py --home ... --config configs/smollm2.yaml \
        --policy configs/gates/smollm2.yaml --dtype float32 chat 2          # a model served in one precision

Evaluates the version with ``lifecycle eval`` once per precision (``evals.engine.dtype`` float32 and bfloat16, or
the ``--dtype`` named: the one its config serves; stored reports are reused), prints the YAML entries to paste
under ``measured:`` in the policy file (the CPU named by ``core.machine``: run it on, or with the variables above
as, each CPU class the model was trained on), and a table of each rule's margin in standard errors against the
policy's current floors. Exit 1 when a margin is below the policy's ``margin_se``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from core.machine import cpu_description  # noqa: E402
from evals.gate import Measurement, floor_margins, load_policy  # noqa: E402

DTYPES = ("float32", "bfloat16")


def measure(home: str, name: str, version: str, dtype: str, config: str | None) -> dict[str, tuple[float, float]]:
    cmd = [str(REPO / ".venv" / "bin" / "lifecycle"), "eval", name, version, "--json", "--home", home]
    cmd += ["--set", f"evals.engine.dtype={dtype}"] + (["--config", config] if config else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"calibrate: lifecycle eval failed ({dtype}): {out.stderr.strip().splitlines()[-1:]}")
    report = json.loads(out.stdout)
    return {
        m["name"]: (round(m["value"], 4), round(m["stderr"], 4))
        for suite in report["suites"]
        for m in suite["metrics"]
        if m["stderr"] is not None
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name")
    p.add_argument("version")
    p.add_argument("--home", required=True, help="the home folder the version was trained in")
    p.add_argument("--config", default=None, help="the config it was trained with (default configs/default.yaml)")
    p.add_argument("--policy", default=str(REPO / "configs" / "gates" / "default.yaml"))
    p.add_argument(
        "--dtype",
        action="append",
        choices=DTYPES,
        help="evaluate in this precision only (repeatable; default: both): a config served in one precision",
    )
    args = p.parse_args(argv)
    policy = load_policy(Path(args.policy))
    cpu = cpu_description()
    measurements = []
    for dtype in args.dtype or DTYPES:
        metrics = measure(args.home, args.name, args.version, dtype, args.config)
        ruled = {k: v for k, v in metrics.items() if k in policy.rules}
        measurements.append(Measurement(cpu=cpu, dtype=dtype, metrics=ruled))  # type: ignore[arg-type]
    print("# paste under `measured:` in", args.policy)
    for m in measurements:
        print(f"  - cpu: {m.cpu!r}")
        print(f"    dtype: {m.dtype}")
        print("    metrics:")
        for k, (v, se) in m.metrics.items():
            print(f"      {k}: [{v}, {se}]")
    need = policy.margin_se or 4.0
    print(f"\n{'metric':<42} {'dtype':<9} {'value':>7} {'stderr':>7} {'bound':>7} {'margin':>8}")
    thin = 0
    for fm in floor_margins(policy, measurements):
        flag = "" if fm.margin_se >= need else f"  < {need:g} SE"
        thin += bool(flag)
        print(
            f"{fm.metric:<42} {fm.dtype:<9} {fm.value:7.3f} {fm.stderr:7.3f} {fm.bound:7.3f} {fm.margin_se:7.1f}σ{flag}"
        )
    return 1 if thin else 0


if __name__ == "__main__":
    raise SystemExit(main())

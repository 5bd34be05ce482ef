"""``cognitora`` console script: one subcommand per job, each living in its own module.

Each subcommand module exposes ``main(argv: list[str]) -> int`` with its own argparse parser, so this file only
dispatches and stays import-light (``cognitora sim`` must not pay for gRPC, ``extproc`` not for the simulator).
"""

from __future__ import annotations

import importlib
import sys

from cognitora.distribution import SIM_DISTRIBUTION, SIM_IMPORT, sim_install_hint

__all__ = ["main"]

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("cognitora_sim.cli", "run a simulated engine fleet (vLLM wire formats)"),
    "collector": ("cognitora.collector", "feed the store from engine KV events and /metrics"),
    "explain": ("cognitora.explain", "show where a prompt would be placed, and why"),
    "extproc": ("envoy_extproc.server", "Envoy ext_proc service"),
    "pd-sidecar": ("cognitora.disagg.sidecar", "beside a decode engine: run a request as a prefill/decode pair"),
    "keys": ("cognitora.api_keys", "API keys for Envoy: a signing key, and a key per team (signed JWTs)"),
    "budgets": ("cognitora.budgets.cli", "token budget reports, limits and resets, from Redis alone"),
    "node-agent": ("cognitora.node_agent.cli", "serve this node's GPU/Mac power under DCGM's metric names"),
    "doctor": ("cognitora.doctor.cli", "check this host: config, Redis, clocks, engines, KV events"),
}


def usage() -> str:
    lines = ["usage: cognitora <command> [options]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines.append("\n'cognitora <command> --help' for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"cognitora: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
    except ModuleNotFoundError as exc:
        # The simulator is its own distribution (sim/): say which line installs it, not a bare import error.
        if name != "sim" or (exc.name or "").split(".")[0] != SIM_IMPORT:
            raise
        print(
            f"cognitora sim: the simulator is not installed ({SIM_DISTRIBUTION} is a distribution of its own): "
            f"{sim_install_hint()}",
            file=sys.stderr,
        )
        return 2
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    raise SystemExit(main())

"""The name this project is installed under, and the install line an error message gives for a missing extra.

The import packages and the command are ``cognitora``; the distribution is ``cognitora-router``, because the name
``cognitora`` on PyPI belongs to another project: an install line naming it would put someone else's code on the
operator's gateway. Every message that says what to install takes its line from here (tests/deploy/test_distribution.py
holds the docs and messages to it).
"""

from __future__ import annotations

from importlib import metadata

__all__ = ["DISTRIBUTION", "SIM_DISTRIBUTION", "SIM_IMPORT", "install_hint", "installed_version", "sim_install_hint"]

DISTRIBUTION = "cognitora-router"
SIM_DISTRIBUTION = "cognitora-sim"
"""The simulator and the test/bench harness (import package ``cognitora_sim``): a distribution of its own, in sim/ of
the repository, so the gateway's wheel carries none of it."""
SIM_IMPORT = "cognitora_sim"


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` (the published name, and the same from a clone until it is published)."""
    return f"pip install '{DISTRIBUTION}[{extra}]' (from a clone of the repository: pip install -e '.[{extra}]')"


def sim_install_hint() -> str:
    """The command that installs the simulator: the ``sim`` extra pulls ``cognitora-sim``, which lives in sim/ of a
    clone (pip takes it from there when it is named beside)."""
    return (
        f"pip install '{DISTRIBUTION}[sim]' "
        f"(from a clone of the repository: pip install -e '.[sim]' -e ./sim, as `make test` and `make demo` do)"
    )


def installed_version() -> str:
    """The installed distribution's version, ``unknown`` when running from a tree that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"

"""What the commands read: plans (`stoke plan --json` output), any file given as ``-`` (stdin), and ``--repo``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from foundation import inputs
from foundation.errors import UserError
from foundation.names import shown

if TYPE_CHECKING:
    from interference.profile import DeviceProfile
    from planner.solver.problem import Plan
    from planner.workload_file import WorkloadsFile


STDIN = "-"


def source_name(path: str) -> str:
    """How errors name a file given on the command line (``<stdin>`` for ``-``)."""
    return "<stdin>" if path == STDIN else path


def read_text_input(path: str, what: str) -> tuple[str, str]:
    """(text, source name) of a file given on the command line; ``-`` reads standard input."""
    if path == STDIN:
        return inputs.read_stream(sys.stdin, source_name(path), what, error=UserError), source_name(path)
    return inputs.read_text(path, what, error=UserError), inputs.shown_path(path)


def read_plan(path: str) -> Plan:
    """The plan in a JSON file (- = stdin); a missing, malformed or incomplete file raises a one-line error."""
    from planner.solver.problem import plan_from_dict  # the solver loads only for commands that need it

    source = inputs.shown_path(source_name(path))
    fix = "write the plan with `stoke plan --json`"
    if path == STDIN:
        text = inputs.read_stream(sys.stdin, source, "plan", error=UserError)
    else:
        text = inputs.read_text(path, "plan", error=UserError, fix=f"write one with `stoke plan --json > {source}`")
    data = inputs.parse_json(text, source, "plan", error=UserError, fix=fix)
    return plan_from_dict(data, source=source)


def add_repo_option(p: argparse.ArgumentParser, help_text: str, *, required: bool = False) -> None:
    """`--repo DIR` (the one spelling); `--repository` is still accepted, hidden from help.

    A required --repo is a required group of the two spellings: argparse checks `required` per option,
    so `required=True` on --repo alone would refuse `--repository DIR`.
    """
    group: argparse._ActionsContainer = p.add_mutually_exclusive_group(required=True) if required else p
    if required:
        group.add_argument("--repo", help=help_text)
    else:
        group.add_argument("--repo", default="triton_repo", help=help_text)
    group.add_argument("--repository", dest="repo", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def check_repo_dir(repo: str, fix: str, *, urls: bool = True, flag: str = "--repo") -> None:
    """A clear error unless `repo` (given with `flag`; "" for an argument) is a model repository folder (or, with
    `urls`, a URL such as s3://bucket/path, checked where it is read). A missing path and a file are told apart."""
    if urls and repo.startswith("s3://"):
        return  # checked where it is read
    if urls and "://" in repo:
        raise UserError(f"{flag + ' ' if flag else ''}{shown(repo)}: only s3:// URLs and local directories; {fix}")
    name = f"{flag} {inputs.shown_path(repo)}" if flag else inputs.shown_path(repo)
    if "\0" in repo or not os.path.exists(repo):
        raise UserError(f"{name}: model repository not found; {fix}")
    if not os.path.isdir(repo):
        what = "is a file, not a directory" if os.path.isfile(repo) else "exists but is not a directory"
        raise UserError(f"{name}: {what} (a model repository is a folder); {fix}")


def warn_unused_gpu_types(source: str, gpu_types: Sequence[str], fate: str, fix: str) -> None:
    """Say (not drop in silence) that a workload file's gpu_types are not used where the controller's nodes are the
    inventory (`workload apply`, `k8s render`): `fate` is what they are not, `fix` where they go instead."""
    if gpu_types:
        print(
            f"stoke: warning: {source}: its gpu_types ({', '.join(shown(t) for t in gpu_types[:8])}) are not {fate}: "
            f"the controller plans on the devices its agents register{fix}",
            file=sys.stderr,
        )


def load_profile_arg(path: str | None) -> DeviceProfile | None:
    """The profile a command's `--profile` names (None without one), or a clear error."""
    from interference.profile_io import ProfileFileError, load_profile

    if path is None:
        return None
    try:
        return load_profile(path)
    except ProfileFileError as err:
        raise UserError(str(err)) from None


def load_problem(path: str | None, profile_path: str | None) -> WorkloadsFile:
    """The workloads file (the bundled example without `path`) checked against the `--profile` given, if any."""
    from planner.workload_file import WorkloadFileError, load_workloads_file

    # The profile replaces every GPU type's before the file is checked: its models are the ones that count.
    profile = load_profile_arg(profile_path)
    try:
        loaded = load_workloads_file(path, profile)
    except WorkloadFileError as err:
        message = str(err)
        if err.field == "path":  # the file itself could not be read
            message += " (without an argument stoke plan uses the bundled example)"
        raise UserError(f"{message} (with the profile {profile_path})" if profile_path else message) from None
    for g in loaded.gpu_types:
        if g.profile.gpu.name != g.name:  # maybe a pool's label, maybe the wrong file: said, not refused
            where = f" ({inputs.shown_path(profile_path)})" if profile_path else ""
            print(
                f"stoke: warning: GPU type {g.name!r} plans with a profile measured on {g.profile.gpu.name!r}{where}; "
                "if that is the device, name the GPU type after it",
                file=sys.stderr,
            )
    return loaded

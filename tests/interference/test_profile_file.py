"""Reading a fitted profile file refuses what the planner cannot use, in one line naming the file, the model or
`gpu`, the field and the fix: share steps, k_act over its domain, measured points, names, numbers, and files
that are not fitted profiles at all. Every reader goes through `profile_from_dict` (`stoke profile show`,
`stoke plan --profile`, a workload file's gpu_types[].profile, the controller's profile upload)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from profiles import accel_sim_profile

from interference.fit import active_time_report
from interference.profile import MAX_ACTIVE_MS
from interference.profile_io import (
    ProfileFileError,
    bundled_data_dir,
    bundled_profile,
    bundled_raw_path,
    load_profile,
    profile_from_dict,
    save_profile,
)
from stoke.cli import main

V100 = json.loads((bundled_data_dir() / "v100-profile.json").read_text())
README = Path(__file__).resolve().parents[2] / "README.md"


def gpu(field, value):
    return lambda d: d["gpu"].__setitem__(field, value)


def ssd(field, value):
    return lambda d: d["models"]["ssd"].__setitem__(field, value)


def domain(field, value):
    return lambda d: d["models"]["ssd"]["domain"].__setitem__(field, value)


STEP = "gpu field 'share_step_pct' must be a share step from 1 to 100 that divides 100"
K_ACT = "models.ssd field 'k_act': k_act"
MEASURED = "models.ssd field 'measured': "
NAME = "gpu field 'name' must be a"
BATCHES = "models.ssd field 'domain': 'batches' must be ascending whole batch sizes from 1 to 32 without repeats"
SHARES = "models.ssd field 'domain': 'shares' must be ascending share percentages above 0, up to 100"

BAD = {
    # 1. the share step: 100/n, 1 to 100
    "step 0.001": (gpu("share_step_pct", 0.001), STEP),
    "step 1e-300": (gpu("share_step_pct", 1e-300), STEP),
    "step 37": (gpu("share_step_pct", 37), "2.5 for 40, 50 for 2), got 37; refit the profile"),
    "step 200": (gpu("share_step_pct", 200), "gpu field 'share_step_pct' must be a positive number up to 100"),
    "step 1e308": (gpu("share_step_pct", 1e308), "gpu field 'share_step_pct' must be a positive number up to 100"),
    "step 0": (gpu("share_step_pct", 0), "gpu field 'share_step_pct' must be a positive number"),
    # 2. k_act over batches 1-32 x every share step, and measured points
    "k_act all 0": (ssd("k_act", [0, 0, 0, 0, 0]), K_ACT + " is not positive at batch 1, share 2.5% (0 ms)"),
    "k_act all -1": (ssd("k_act", [-1] * 5), K_ACT + " is not positive at batch 1, share 2.5%"),
    "k_act all 1e308": (ssd("k_act", [1e308] * 5), K_ACT + " is more than an hour (3.6e+06 ms) at batch 1"),
    "k_act a nanosecond": (ssd("k_act", [0, 0, 0, 0, 1e-6]), K_ACT + " is less than a microsecond"),
    "k_act negative at batch 32": (ssd("k_act", [-1, 10, 5, 0, 0]), K_ACT + " is not positive at batch 11"),
    "measured 1e308 ms": (ssd("measured", [[1, 10.0, 1e308]]), MEASURED + "[1, 10.0, 1e+308] is not [batch"),
    "measured 1e-300 ms": (ssd("measured", [[1, 10.0, 1e-300]]), MEASURED + "[1, 10.0, 1e-300] is not"),
    "measured share 1e-300": (ssd("measured", [[1, 1e-300, 5.0]]), MEASURED + "[1, 1e-300, 5.0] is not"),
    "measured share off the steps": (ssd("measured", [[1, 11.0, 5.0]]), "a multiple of the 2.5% share step"),
    "measured share over 100": (ssd("measured", [[1, 102.5, 5.0]]), MEASURED + "[1, 102.5, 5.0] is not"),
    "measured batch true": (ssd("measured", [[True, 10.0, 5.0]]), MEASURED + "[True, 10.0, 5.0] is not"),
    "measured batch 33": (ssd("measured", [[33, 10.0, 5.0]]), "batch 1-32"),
    # 3. the one name rule
    "name ESC": (gpu("name", "\x1b[31mRED"), NAME + " name of 1-128 characters"),
    "name NUL": (gpu("name", "V100\x00"), NAME + " name of"),
    "name U+202E": (gpu("name", "V100\u202e"), NAME + " name of"),
    "name 1 MB": (gpu("name", "x" * 1_000_000), "... (1000000 characters)"),
    "name blank": (gpu("name", "   "), NAME + " non-empty name"),
    "name not a string": (gpu("name", 100), NAME + " name, got the number 100"),
    # 4. numbers
    "memory_mib 1e308": (gpu("memory_mib", 1e308), "gpu field 'memory_mib' must be a number of MiB from 0"),
    "context_mib -1": (gpu("context_mib", -1), "gpu field 'context_mib' must be a number of MiB from 0"),
    "weights_mib 2 TiB": (ssd("weights_mib", 2 * 1024**2), "models.ssd field 'weights_mib' must be a number of MiB"),
    "idle_time_ms 1e308": (ssd("idle_time_ms", 1e308), "models.ssd field 'idle_time_ms' must be a number of ms"),
    "idle_time_ms -1": (ssd("idle_time_ms", -1), "models.ssd field 'idle_time_ms' must be a number of ms from 0"),
    # the planner multiplies the L2 and power lines by rates: 1e308 overflowed to inf, then IndexError
    "l2_slope 1e308": (ssd("l2_slope", 1e308), "models.ssd field 'l2_slope' must be a number from -1e+12 to 1e+12"),
    "power_intercept -1e300": (ssd("power_intercept_w", -1e300), "field 'power_intercept_w' must be a number from"),
    "kernels 0.5": (ssd("kernels", 0.5), "models.ssd field 'kernels' must be a whole number >= 1"),
    "kernels 0": (ssd("kernels", 0), "models.ssd field 'kernels' must be a whole number >= 1"),
    "max_clients 0.5": (gpu("max_clients", 0.5), "gpu field 'max_clients' must be a whole number >= 0 up to 4,096"),
    "max_clients 1e300": (gpu("max_clients", 1e300), "gpu field 'max_clients' must be a whole number"),
    "max_clients 5000": (gpu("max_clients", 5000), "got 5000"),
    "batches -5,0,32": (domain("batches", [-5, 0, 32]), BATCHES + ", got [-5, 0, 32]"),
    "batches true,16,32": (domain("batches", [True, 16, 32]), BATCHES),
    "batches 1,16,64": (domain("batches", [1, 16, 64]), BATCHES),
    "batches 1,32,16": (domain("batches", [1, 32, 16]), BATCHES),
    "batches 1,16,16": (domain("batches", [1, 16, 16]), BATCHES),
    "shares -10,0,1e308": (domain("shares", [-10, 0, 1e308]), SHARES + ", without repeats, got [-10, 0, 1e+308]"),
    "shares 10,50,100.5": (domain("shares", [10, 50, 100.5]), SHARES),
    "shares 50,10,100": (domain("shares", [50, 10, 100]), SHARES),
    "shares true": (domain("shares", [True, 50, 100]), SHARES),
    # 5. not a fitted profile
    "no format_version": (lambda d: d.pop("format_version"), "has no format_version, so it is not a fitted profile"),
    "format_version true": (lambda d: d.__setitem__("format_version", True), "format_version True is not supported"),
}


@pytest.mark.parametrize("edit, fragment", BAD.values(), ids=BAD.keys())
def test_a_bad_profile_is_refused_in_one_line(edit, fragment):
    data = copy.deepcopy(V100)
    edit(data)
    with pytest.raises(ProfileFileError) as err:
        profile_from_dict(data, "bad.json")
    message = str(err.value)
    assert fragment in message
    assert message.startswith("bad.json: ") and "\n" not in message and len(message) < 600
    assert message.isprintable()  # no ESC, NUL or bidi character reaches a terminal


@pytest.mark.parametrize(
    "old, new, fragment",
    [
        ('"memory_mib": 16160.0', '"memory_mib": 1' + "0" * 400, "gpu field 'memory_mib' must be a number of MiB"),
        ('"max_clients": 48', '"max_clients": 1' + "0" * 400, "gpu field 'max_clients' must be a whole number"),
        ('"batches": [1, 16, 32]', '"batches": [1, 16, 1' + "0" * 400 + "]", "'batches' must be ascending whole"),
        ('"kernels": 93', '"kernels": -1' + "0" * 400, "models.ssd field 'kernels' must be a whole number >= 1"),
    ],
)
def test_integers_too_large_for_a_float_are_refused_as_out_of_range(tmp_path, old, new, fragment):
    text = json.dumps(V100)
    assert old in text
    path = tmp_path / "big.json"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ProfileFileError, match="big.json: ") as err:
        load_profile(path)
    assert fragment in str(err.value)


def test_the_bundled_profiles_and_plain_variants_load():
    assert bundled_profile().gpu.share_step_pct == 2.5 and len(bundled_profile().models) == 4
    cpu = load_profile(bundled_data_dir() / "cpu-2core-profile.json")
    assert cpu.gpu.share_step_pct == 50.0 and cpu.gpu.max_clients == 0
    data = copy.deepcopy(V100)
    data["gpu"]["max_clients"] = 48.0  # a whole number written as a float is that number
    data["models"]["ssd"]["kernels"] = 93.0
    data["gpu"]["name"] = " V100 "  # surrounding space is stripped, as for every name
    data["models"]["ssd"]["measured"] = [[4, 50.0, 9.5], [32, 100, 80]]
    profile = profile_from_dict(data, "ok.json")
    assert profile.gpu.max_clients == 48 and isinstance(profile.gpu.max_clients, int)
    assert profile.models["ssd"].kernels == 93 and isinstance(profile.models["ssd"].kernels, int)
    assert profile.gpu.name == "V100" and profile.models["ssd"].measured == ((4, 50.0, 9.5), (32, 100.0, 80.0))


@pytest.mark.parametrize("cores", [1, 3, 7, 64, 100])
def test_a_share_step_of_100_over_n_loads_as_fitted(tmp_path, cores):
    """A fit stores 100/cores rounded to 6 decimals (33.333333): that divides 100 within the tolerance."""
    save_profile(accel_sim_profile(cores), tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").gpu.share_step_pct == round(100.0 / cores, 6)


def test_the_fitter_and_the_reader_check_k_act_alike():
    """One check (`interference.profile.active_time_problems`): the fit reports what the reader refuses."""
    batch, share = np.array([1.0, 32.0, 1.0, 32.0]), np.array([10.0, 10.0, 100.0, 100.0])
    with np.errstate(all="ignore"):
        report = active_time_report("m", (1e308,) * 5, batch, share, np.ones(4), share_step_pct=2.5)
    assert report.problems == (f"k_act is more than an hour ({MAX_ACTIVE_MS:g} ms) at batch 1, share 2.5% (inf ms)",)
    data = copy.deepcopy(V100)
    data["models"]["ssd"]["k_act"] = [1e308] * 5
    with pytest.raises(ProfileFileError, match=r"models\.ssd field 'k_act': k_act is more than an hour"):
        profile_from_dict(data, "bad.json")


def test_a_file_too_large_is_refused_before_it_is_read_whole():
    with pytest.raises(ProfileFileError, match=r"^/dev/zero: profile is larger than 32 MiB"):
        load_profile("/dev/zero")


def test_measurements_and_raw_files_are_named_with_the_command_that_fits_them(tmp_path):
    measurements = bundled_data_dir() / "cpu-2core-measurements.json"
    with pytest.raises(ProfileFileError) as err:
        load_profile(measurements)
    assert str(err.value) == (
        f"{measurements}: this looks like a measurements file (`stoke profile run` output), not a fitted profile; "
        "fit it with `stoke profile fit FILE -o profile.json`"
    )
    with pytest.raises(ProfileFileError) as err:
        load_profile(bundled_raw_path())
    assert str(err.value).startswith(f"{bundled_raw_path()}: this looks like raw measurements (JSON lines")
    assert str(err.value).endswith("not a fitted profile; fit it with `stoke profile fit FILE -o profile.json`")
    one_line = tmp_path / "raw.json"
    one_line.write_text('{"hardware": {"unit": 2.5}}\n')
    with pytest.raises(ProfileFileError, match=r"raw.json: this looks like raw measurements"):
        load_profile(one_line)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, edit):
    data = copy.deepcopy(V100)
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (gpu("name", "\x1b[31mRED"), "gpu field 'name' must be a name of"),
        (ssd("k_act", [0, 0, 0, 0, 0]), "models.ssd field 'k_act': k_act is not positive at batch 1"),
        (ssd("measured", [[1, 1e-300, 5.0]]), "models.ssd field 'measured': [1, 1e-300, 5.0] is not"),
        (gpu("share_step_pct", 0.001), "gpu field 'share_step_pct' must be a share step"),
    ],
    ids=["escape in the name", "k_act all 0", "measured share 1e-300", "step 0.001"],
)
def test_profile_show_and_plan_refuse_a_bad_profile_in_one_line(capsys, tmp_path, edit, fragment):
    path = write(tmp_path, edit)
    for argv in (["profile", "show", str(path)], ["plan", "--profile", str(path)]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "", argv
        assert err.startswith(f"stoke: error: {path}: ") and err.count("\n") == 1, err
        assert fragment in err and "Traceback" not in err and "\x1b" not in err


def test_a_workload_files_profile_is_read_by_the_same_reader(capsys, tmp_path):
    path = write(tmp_path, ssd("k_act", [-1] * 5))
    workloads = tmp_path / "w.yaml"
    workloads.write_text(
        f"gpu_types:\n  - {{name: V100, price_per_hour: 3, profile: {path}}}\n"
        "workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 100}\n"
    )
    code, _, err = run(capsys, "plan", str(workloads))
    assert code == 2 and err.count("\n") == 1
    assert f"gpu_types[0].profile: {path}: models.ssd field 'k_act': k_act is not positive" in err


def test_profile_show_names_a_measurements_file(capsys):
    measurements = bundled_data_dir() / "cpu-2core-measurements.json"
    code, _, err = run(capsys, "profile", "show", str(measurements))
    assert code == 2 and "this looks like a measurements file" in err and "None" not in err
    assert "`stoke profile fit FILE -o profile.json`" in err
    code, _, err = run(capsys, "profile", "show", str(bundled_raw_path()))
    assert code == 2 and "this looks like raw measurements" in err and "stoke profile fit" in err


def test_a_missing_raw_field_points_at_the_readme_which_lists_every_key(capsys, tmp_path):
    lines = bundled_raw_path().read_text().splitlines()
    raw = tmp_path / "raw1.jsonl"
    raw.write_text("\n".join(line for line in lines if "maxGPUfrequency" not in line) + "\n")
    code, _, err = run(capsys, "profile", "fit", str(raw), "-o", str(tmp_path / "p.json"))
    assert code == 2 and "lacks field 'maxGPUfrequency'" in err
    assert 'README.md, "Bring your own profile"' in err and "inference-model.md" not in err
    section = README.read_text().split("## Bring your own profile")[1].split("\n## ")[0]
    keys = {key for line in lines for values in json.loads(line).values() for key in values}
    assert keys and all(f"`{key}`" in section for key in keys), sorted(k for k in keys if f"`{k}`" not in section)


def test_the_fit_refuses_what_the_reader_would(capsys, tmp_path):
    """What `stoke profile fit` or `run` would write must load: the share step, the GPU name, the batches."""
    lines = bundled_raw_path().read_text().splitlines()
    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join(line.replace('{"unit": 2.5}', '{"unit": 37}') for line in lines) + "\n")
    code, _, err = run(capsys, "profile", "fit", str(raw), "-o", str(tmp_path / "p.json"))
    assert code == 2 and "section 'hardware' field 'unit' must be a share step from 1 to 100" in err
    code, _, err = run(capsys, "profile", "fit", str(bundled_raw_path()), "--gpu-name", "my gpu", "-o", "x.json")
    assert code == 2 and "--gpu-name must be a name of" in err
    code, _, err = run(capsys, "profile", "run", "--batches", "1,64", "-o", str(tmp_path / "m.json"))
    assert code == 2 and "--batches must be batch sizes from 1 to 32" in err


def test_a_key_repeated_in_a_profile_or_its_measurements_is_refused(capsys, tmp_path):
    # the last value won silently: a second "gpu" object replaced the first
    profile = tmp_path / "p.json"
    text = json.dumps(V100, indent=1)
    profile.write_text(text[:-1] + ', "gpu": {}}')
    with pytest.raises(ProfileFileError, match=r"p.json: key 'gpu' repeated \(at the top level\); keep one$"):
        load_profile(profile)
    for argv in (["profile", "show", str(profile)], ["plan", "--profile", str(profile)]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "", argv
        assert err == f"stoke: error: {profile}: key 'gpu' repeated (at the top level); keep one\n"
    measurements = tmp_path / "m.json"
    text = (bundled_data_dir() / "cpu-2core-measurements.json").read_text()
    measurements.write_text(text.replace('"cores": 2,', '"cores": 2, "cores": 64,', 1))
    code, out, err = run(capsys, "profile", "fit", str(measurements), "-o", str(tmp_path / "fitted.json"))
    assert code == 2 and f"{measurements}: key 'cores' repeated (at the top level); keep one" in err
    raw = tmp_path / "raw.jsonl"  # iGniter JSON lines: the line is named
    raw.write_text('{"hardware": {"idlepower": 53.5}}\n{"hardware": {"power": [117.5], "power": [1.0]}}\n')
    code, out, err = run(capsys, "profile", "fit", str(raw), "-o", str(tmp_path / "fitted.json"))
    assert code == 2 and f"{raw}:2: key 'power' repeated (in hardware); keep one" in err
    assert not (tmp_path / "fitted.json").exists()

import json

import numpy as np
import pytest
from floats import PROFILE_ROUNDED, assert_close
from sklearn.exceptions import NotFittedError

from interference.fit import GRID_BATCHES, GRID_SHARES, InterferenceModel, RawProfileError
from interference.latency import predict_gpu
from interference.profile import PROFILE_FORMAT_VERSION
from interference.profile_io import (
    ProfileFileError,
    bundled_profile,
    bundled_raw_path,
    load_profile,
    profile_to_dict,
    read_raw,
    save_profile,
)


@pytest.fixture(scope="module")
def raw():
    return read_raw(bundled_raw_path())


def test_fit_reproduces_the_measured_solo_grid(raw):
    profile = InterferenceModel().fit(raw).profile_
    for model in ("alexnet", "resnet50", "vgg19", "ssd"):
        measured = np.asarray(raw[model]["gpulatency"])
        for i, b in enumerate(GRID_BATCHES):
            for j, r in enumerate(GRID_SHARES):
                predicted = predict_gpu(profile, [(model, b, r)])[0].gpu_ms
                assert predicted == pytest.approx(measured[i, j], rel=0.08), (model, b, r)


def test_fit_is_deterministic_and_matches_the_bundled_profile(raw):
    first = profile_to_dict(InterferenceModel().fit(raw).profile_)
    second = profile_to_dict(InterferenceModel().fit(raw).profile_)
    assert first == second  # the same computation twice in one process: bit for bit
    # bundled on another machine: BLAS digits differ, and the fields rounded to 6 decimals by a step
    assert_close(first, profile_to_dict(bundled_profile()), abs_tol=PROFILE_ROUNDED)


def test_estimator_conventions(raw):
    model = InterferenceModel(gpu_name="V100")
    assert model.get_params() == {"gpu_name": "V100"}
    with pytest.raises(NotFittedError, match="fit"):
        model.predict([[("alexnet", 1, 50)]])
    assert model.fit(raw) is model
    [[(latency, throughput)]] = model.predict([[("alexnet", 1, 100)]])
    assert 0 < latency < 2 and throughput > 500


def test_colocation_checkpoint_close_to_published_measurement():
    # inference-model.md: measured on a V100 at the iGniter plan (server compute latency, ms)
    profile = bundled_profile()
    predictions = predict_gpu(profile, [("vgg19", 6, 37.5), ("resnet50", 8, 30), ("alexnet", 4, 10)])
    for prediction, measured in zip(predictions, (27.702, 18.458, 6.612)):
        assert prediction.latency_ms == pytest.approx(measured, rel=0.1)


def test_missing_field_is_named(raw):
    broken = {k: dict(v) for k, v in raw.items()}
    del broken["vgg19"]["kernel"]
    with pytest.raises(RawProfileError, match=r"'vgg19' lacks field 'kernel'"):
        InterferenceModel().fit(broken)
    broken = {k: dict(v) for k, v in raw.items()}
    broken["alexnet"]["gpulatency"] = [[1, 2], [3, 4]]
    with pytest.raises(RawProfileError, match="3x3 grid"):
        InterferenceModel().fit(broken)


def test_saved_profile_round_trips_with_format_version(tmp_path):
    path = tmp_path / "p.json"
    assert save_profile(bundled_profile(), path) is True
    assert save_profile(bundled_profile(), path) is False  # unchanged bytes: not rewritten
    assert json.loads(path.read_text())["format_version"] == PROFILE_FORMAT_VERSION
    assert load_profile(path) == bundled_profile()


def test_wrong_format_version_and_missing_field_are_refused(tmp_path):
    data = profile_to_dict(bundled_profile())
    data["format_version"] = 99
    (tmp_path / "old.json").write_text(json.dumps(data))
    with pytest.raises(ProfileFileError, match="format_version 99"):
        load_profile(tmp_path / "old.json")
    data = profile_to_dict(bundled_profile())
    del data["models"]["ssd"]["k_act"]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ProfileFileError, match=r"models\.ssd lacks field 'k_act'"):
        load_profile(tmp_path / "bad.json")


def test_raw_reader_reports_the_bad_line(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text('{"hardware": {"unit": 2.5}}\n{not json}\n')
    with pytest.raises(ProfileFileError, match=r"raw.jsonl:2: not valid JSON"):
        read_raw(path)


BAD_RAW = {  # a line appended to the bundled raw file (line 71) -> what the error must say
    "misspelt key": (
        '{"hardware": {"memory_mb": 16160}}',
        "section 'hardware' has unknown key 'memory_mb' (did you mean 'memory_mib'?)",
    ),
    "repeated key": (
        '{"alexnet": {"kernel": 9999}}',
        "section 'alexnet' key 'kernel' is given again (first on line 62)",
    ),
    "fractional count": (
        '{"hardware": {"max_clients": 4.5}}',
        "key 'max_clients' must be a whole number from 0 to 4,096, got 4.5",
    ),
    "percentage": ('{"vgg19": {"l2cache": 1600}}', "key 'l2cache' must be a percentage above 0, up to 100, got 1600"),
    "boolean kernels": (
        '{"ssd": {"kernel": true}}',
        "section 'ssd' key 'kernel' must be a whole number of kernels from 1",
    ),
    "negative idle time": (
        '{"ssd": {"idletime_1": -0.03}}',
        "section 'ssd' key 'idletime_1' must be a number of ms from 0",
    ),
    "ragged grid": (
        '{"bert": {"gpulatency": [[3.6, 0.93], [16.7, 3.6, 2.0], [32, 7, 4]]}}',
        "key 'gpulatency' must be a 3x3 grid [batch 1, 16, 32][share 10, 50, 100%]",
    ),
    "huge latency": (
        '{"bert": {"gpulatency": [[1e300, 0.93, 0.7], [16.7, 3.6, 2.0], [32, 7, 4]]}}',
        "(item [0][0] is 1e+300)",
    ),
    "path in a name": ('{"alex/net": {"kernel": 3}}', "section 'alex/net' is neither 'hardware' nor a model name"),
    "dot-dot name": ('{"..": {"kernel": 3}}', "section '..' is neither"),
    "empty name": ('{"": {"kernel": 3}}', "section '' is neither"),
    "escape in a name": ('{"a\\u001b[31m": {"kernel": 3}}', "section 'a\\x1b[31m' is neither"),
}


@pytest.mark.parametrize("line,message", BAD_RAW.values(), ids=BAD_RAW.keys())
def test_raw_keys_and_values_are_checked_at_their_line_before_fitting(tmp_path, line, message):
    path = tmp_path / "raw.jsonl"
    path.write_text(bundled_raw_path().read_text() + line + "\n")
    with pytest.raises(ProfileFileError) as err:
        read_raw(path)
    assert str(err.value).startswith(f"{path}:71: ") and message in str(err.value)
    assert "\x1b" not in str(err.value)


def test_raw_ignored_keys_stay_accepted_and_context_above_memory_is_refused(tmp_path):
    text = bundled_raw_path().read_text()
    path = tmp_path / "raw.jsonl"
    path.write_text(text + '{"ssd": {"htddur": [1, 2], "power_2": "n/a"}}\n')  # README: ignored, whatever they hold
    assert read_raw(path)["ssd"]["htddur"] == [1, 2]
    path.write_text(text.replace('"context_mib": 500', '"context_mib": 20000'))
    with pytest.raises(
        ProfileFileError,
        match=r"raw.jsonl:66: section 'hardware' key 'context_mib' \(20,000 MiB\) "
        r"exceeds its 'memory_mib' \(16,160 MiB, line 66\)",
    ):
        read_raw(path)


def test_raw_sections_given_as_data_are_checked_too(raw):
    from interference.profile import MAX_ACTIVE_MS
    from interference.raw_layout import MAX_MS

    assert MAX_MS == MAX_ACTIVE_MS  # raw times are bounded as the fitted ones (raw_layout loads no numpy)
    broken = {k: dict(v) for k, v in raw.items()}
    broken["alexnet"]["kernel"] = True  # once: the fitted profile's reader named 'kernels' and said "refit"
    with pytest.raises(RawProfileError, match=r"section 'alexnet' key 'kernel' must be a whole number of kernels"):
        InterferenceModel().fit(broken)

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

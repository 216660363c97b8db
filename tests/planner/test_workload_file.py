"""Workload files: declared once (planner/workload_file.py), the committed JSON Schema matches, and the
schema accepts and refuses what the loader does."""

from __future__ import annotations

import json

import pytest
import yaml

from foundation import inputs
from planner.workload_file import (
    SCHEMA_FILE,
    WorkloadFileError,
    example_workloads_path,
    load_workloads_file,
    workloads_schema,
)


def test_the_committed_json_schema_is_generated_from_the_declarations():
    assert json.loads(SCHEMA_FILE.read_text()) == workloads_schema(), "stale schema: run `make schema`"
    workload = workloads_schema()["properties"]["workloads"]["items"]
    assert workload["required"] == ["name", "model", "slo_ms", "rate_rps"]
    assert workload["properties"]["arrivals"] == {
        "enum": ["poisson", "constant"],
        "description": "poisson (independent users) or constant (paced clients)",
        "default": "poisson",
    }


GOOD = "workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 100}\n"


@pytest.mark.parametrize(
    "text, valid",
    [
        (GOOD, True),
        (GOOD + "gpu_types:\n  - {name: V100, price_per_hour: 3.06, max_count: 4}\n", True),
        (
            "workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 100, arrivals: constant, gpu_type: V100}\n",
            True,
        ),
        ("workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 0}\n", False),
        ("workloads:\n  - {name: a, model: vgg19, slo_ms: 60}\n", False),
        ("workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 10, arrivals: bursty}\n", False),
        ("workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 10, colour: red}\n", False),
        ("workloads: []\n", False),
        (GOOD + "gpu_types:\n  - {name: V100, price_per_hour: -1}\n", False),
        (GOOD + "gpu_types:\n  - {name: V100, price_per_hour: 3, max_count: -2}\n", False),
        (GOOD + "owner: me\n", False),
        # YAML 1.2 exponents (the schema's reading) are numbers to the loader too
        ("workloads:\n  - {name: a, model: vgg19, slo_ms: 6e1, rate_rps: 1e2}\n", True),
        # bounded: a price of 1e308 made a two-GPU plan cost inf, written as `Infinity` by --json
        (GOOD + "gpu_types:\n  - {name: V100, price_per_hour: 1.0e+308}\n", False),
        (GOOD + "gpu_types:\n  - {name: V100, price_per_hour: 3, max_count: 99999999999999999999}\n", False),
    ],
)
def test_the_schema_accepts_and_refuses_what_the_loader_does(tmp_path, text, valid):
    import jsonschema

    path = tmp_path / "w.yaml"
    path.write_text(text)
    schema_ok = jsonschema.Draft202012Validator(workloads_schema()).is_valid(inputs.parse_yaml(text, "w.yaml", "file"))
    try:
        load_workloads_file(path)
        loader_ok = True
    except WorkloadFileError:
        loader_ok = False
    assert schema_ok == loader_ok == valid


def test_the_bundled_example_follows_the_schema():
    import jsonschema

    data = yaml.safe_load(example_workloads_path().read_text())
    jsonschema.Draft202012Validator(workloads_schema()).validate(data)
    assert len(load_workloads_file().workloads) == len(data["workloads"])


@pytest.mark.parametrize(
    "text",
    [GOOD + "on: 1\n", "workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 100, 5: x}\n"],
)
def test_a_key_yaml_reads_as_a_value_is_refused_in_one_line(tmp_path, text):
    # `on:` is the boolean True to YAML 1.1, `5:` a number: sorting them among text keys raised TypeError
    path = tmp_path / "w.yaml"
    path.write_text(text)
    with pytest.raises(WorkloadFileError, match=r"is not text; known keys: .* \(quote a key such as 'on'"):
        load_workloads_file(path)


def test_a_rate_of_310_digits_is_out_of_range_not_a_crash(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: " + "9" * 310 + "}\n")
    with pytest.raises(WorkloadFileError, match="rate_rps must be"):
        load_workloads_file(path)


def test_a_workload_that_is_not_a_mapping_is_named_with_its_value(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(GOOD + "  - 5\n")
    with pytest.raises(WorkloadFileError, match=r"workloads\[\d+\] must be a mapping of keys \(name, .*\), got 5$"):
        load_workloads_file(path)


def test_a_repeated_key_in_a_gpu_type_is_refused_with_its_line(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(
        "gpu_types:\n  - name: V100\n    price_per_hour: 3.06\n    price_per_hour: 0.5\n"
        "workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 100}\n"
    )
    with pytest.raises(WorkloadFileError) as err:  # the cheaper price won silently
        load_workloads_file(path)
    assert str(err.value) == (
        f"{path}: line 4: key 'price_per_hour' repeated (in gpu_types[0], first at line 3); keep one"
    )


def test_a_name_yaml_reads_as_a_boolean_says_to_quote_it(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("workloads:\n  - {name: yes, model: vgg19, slo_ms: 60, rate_rps: 100}\n")
    with pytest.raises(WorkloadFileError, match=r"name must be a name, got the boolean True; quote it"):
        load_workloads_file(path)


def test_a_profile_for_a_file_whose_workloads_pin_the_default_type_keeps_its_name(tmp_path):
    """A file without gpu_types plans on the --profile's device, but not when its workloads name the default type:
    `gpu_type: V100` beside an A100 profile planned before, and must still (the CLI warns the names differ)."""
    from dataclasses import replace as with_

    from interference.profile_io import bundled_profile

    a100 = bundled_profile()
    a100 = with_(a100, gpu=with_(a100.gpu, name="A100"))
    path = tmp_path / "w.yaml"
    path.write_text("workloads:\n  - {name: a, model: vgg19, slo_ms: 60, rate_rps: 100, gpu_type: V100}\n")
    assert [g.name for g in load_workloads_file(path, a100).gpu_types] == ["V100"]
    path.write_text(GOOD)
    assert [g.name for g in load_workloads_file(path, a100).gpu_types] == ["A100"]

"""`stoke train` commands on the bundled defaults and on user files (in-process)."""

from __future__ import annotations

import json

import pytest
import yaml

from stoke.cli import main
from training import readers


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["train", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_defaults_reproduce_published_case(capsys):
    code, out, _ = run(capsys, "plan", "--json")
    body = json.loads(out)
    assert code == 0 and body["feasible"]
    assert body["counts"] == {"p3.2xlarge": 2, "g4dn.4xlarge": 0, "g3.8xlarge": 2, "g3.16xlarge": 0, "p2.8xlarge": 0}
    assert body["predicted_time_s"] == pytest.approx(1884, abs=2) and body["predicted_cost"] == pytest.approx(
        1.68, abs=0.01
    )
    assert body["prices"]["source"] == "offline" and body["prices"]["as_of"]
    code, out, _ = run(capsys, "plan")
    assert "predicted time 1884.4 s, cost $1.68" in out and "p3.2xlarge" in out


def test_plan_homogeneous_and_infeasible(capsys):
    code, out, _ = run(capsys, "plan", "--strategy", "homogeneous", "--json")
    body = json.loads(out)
    assert code == 0 and body["strategy"] == "homogeneous" and body["feasible"]
    assert sum(1 for c in body["counts"].values() if c) == 1 and body["ps_count"] >= 1
    assert body["bottleneck"] in ("worker_compute", "worker_network", "ps_network", "ps_cpu")
    code, out, _ = run(capsys, "plan", "--deadline", "900")
    assert code == 1 and "INFEASIBLE" in out and "537 s below" in out


def test_plan_bad_spec_names_file_and_field(capsys, tmp_path):
    data, _ = readers.read_spec(None)
    del data["workers"]["g3.8xlarge"]["speed"]
    bad = tmp_path / "spec.yaml"
    bad.write_text(yaml.safe_dump(data))
    code, _, err = run(capsys, "plan", str(bad))
    assert code == 2 and str(bad) in err and "workers.g3.8xlarge" in err and "'speed'" in err
    data["workers"]["g3.8xlarge"]["speed"] = 1018
    data["workers"]["nope.large"] = {"quota": 1, "speed": 1, "gpu_batch": 1}
    bad.write_text(yaml.safe_dump(data))
    code, _, err = run(capsys, "plan", str(bad))
    assert code == 2 and "nope.large" in err and "catalog" in err
    code, _, err = run(capsys, "plan", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read" in err


def test_fit_loss_default_and_files(capsys, tmp_path):
    code, out, _ = run(capsys, "fit-loss", "--json", "--target", "0.9")
    body = json.loads(out)
    assert code == 0 and body["kind"] == "loss_curve" and body["points"] == 31
    assert body["samples_to_target"] == pytest.approx(1.125e7, rel=0.1)
    csv = tmp_path / "curve.csv"
    csv.write_text("iteration,loss\n0,4\n10,3\n20,2\n30,1.5\n")
    code, _, err = run(capsys, "fit-loss", str(csv))
    assert code == 2 and "batch" in err
    out_file = tmp_path / "fit.json"
    code, out, _ = run(capsys, "fit-loss", str(csv), "--batch", "256", "-o", str(out_file))
    assert code == 0 and json.loads(out_file.read_text())["curve"]["beta0"] > 0
    assert "homogeneous.curve" in out


def test_fit_loss_table_shows_the_coefficients_as_written_to_the_json(capsys):
    code, out, _ = run(capsys, "fit-loss", "--json")
    curve = json.loads(out)["curve"]
    code, out, _ = run(capsys, "fit-loss")
    assert code == 0 and "paste into SPEC.yaml" in out
    shown = dict(line.split() for line in out.splitlines() if line.startswith("beta"))
    assert {k: float(v) for k, v in shown.items()} == curve  # e.g. beta1 0.248645, not 0.25; beta0 not 0.00
    assert all(float(v) != 0 for v in shown.values())


def test_fit_loss_heterogeneous_layout(capsys, tmp_path):
    rows = ["b_w,R,n,j,loss"]
    for n in (1, 2, 4):
        for b in (512, 1024):
            for j in (500, 2000, 6000, 12000):
                loss = (-0.2 * b + 2507.6) * (n**0.5) / (j + 876.5) + 0.5
                rows.append(f"{b},0.5,{n},{j},{loss}")
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join(rows) + "\n")
    code, out, _ = run(capsys, "fit-loss", str(csv), "--r-weight", "0", "--json")
    body = json.loads(out)
    assert code == 0 and body["kind"] == "spot_loss"
    assert body["loss"]["g5"] == pytest.approx(0.5, abs=0.01) and body["rmse"] < 1e-3


@pytest.mark.parametrize("model", ["resnet50", "vgg19"])
def test_comm_sim_compares_schedulers(capsys, model):
    code, out, _ = run(capsys, "comm-sim", "--model", model, "--json")
    body = json.loads(out)
    times = {r["scheduler"]: r["iteration_ms"] for r in body["results"]}
    assert code == 0 and set(times) == {"fifo", "priority", "blocks"}
    assert times["blocks"] < times["priority"] < times["fifo"]
    code, out, _ = run(capsys, "comm-sim", "--model", model, "--scheduler", "blocks")
    assert code == 0 and "blocks" in out and "fifo " not in out


def test_comm_sim_bad_profile(capsys, tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("bandwidth_mb_s: 1000\nlayers: []\n")
    code, _, err = run(capsys, "comm-sim", str(bad))
    assert code == 2 and "layers" in err


def test_render_writes_valid_manifests(capsys, tmp_path):
    target = tmp_path / "k8s.yaml"
    code, out, _ = run(capsys, "render", "-o", str(target))
    docs = list(yaml.safe_load_all(target.read_text()))
    assert code == 0 and "wrote 6 objects" in out
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert ("StatefulSet", "resnet110-cifar100-worker-g3-8xlarge") in kinds
    assert (
        sum(d["spec"]["replicas"] for d in docs if d["kind"] == "StatefulSet" and "worker" in d["metadata"]["name"])
        == 4
    )


def test_watch_without_aws_credentials_is_a_stoke_error_with_the_fix(capsys, no_aws_credentials):
    argv = ["watch", "--endpoint-url", "http://127.0.0.1:9", "--max-polls", "1", "--interval", "0.01"]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "Unable to locate credentials" in err and "AWS_PROFILE" in err and "aws configure" in err
    assert err.count("stoke: error:") == 1


def test_watch_help_says_when_spec_is_needed(capsys):
    with pytest.raises(SystemExit):
        run(capsys, "watch", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "required with a PLAN.json" in text and "default: the bundled one" not in text


def test_dash_o_with_a_format_name_means_the_format_not_a_file(capsys, tmp_path, monkeypatch):
    """`train plan -o json` prints JSON (kubectl's -o) instead of writing a file named `json`; a real path is
    still the file to write, and ./json writes one named json."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "plan", "-o", "json")
    assert code == 0 and json.loads(out)["feasible"] and not (tmp_path / "json").exists()
    code, out, _ = run(capsys, "plan", "-o", "yaml")
    assert code == 0 and yaml.safe_load(out)["feasible"] and not (tmp_path / "yaml").exists()
    code, out, _ = run(capsys, "plan", "-o", "./json")
    assert code == 0 and json.loads((tmp_path / "json").read_text())["feasible"] and "predicted time" in out
    (tmp_path / "json").unlink()
    code, out, _ = run(capsys, "fit-loss", "-o", "json")
    assert code == 0 and json.loads(out)["kind"] and list(tmp_path.iterdir()) == []


def test_render_format_is_yaml_or_json_as_the_readme_says(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "render")
    yaml_objects = [o for o in yaml.safe_load_all(out) if o]
    assert code == 0 and {o["kind"] for o in yaml_objects} == {"Service", "StatefulSet"}
    code, out, _ = run(capsys, "render", "--format", "json")
    body = json.loads(out)
    assert code == 0 and body["kind"] == "List" and body["items"] == yaml_objects
    code, out, _ = run(capsys, "render", "-o", "json")  # -o FORMAT means the format here too
    assert code == 0 and json.loads(out) == body and not (tmp_path / "json").exists()
    code, out, _ = run(capsys, "render", "--format", "json", "-o", "k8s.json")
    assert code == 0 and json.loads((tmp_path / "k8s.json").read_text()) == body


def test_commands_that_need_a_file_refuse_a_bare_format_name(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv in (["profile", "fit", "-", "-o", "json"], ["profile", "run", "-o", "yaml"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "is an output format" in err and "./" in err, err
    assert list(tmp_path.iterdir()) == []

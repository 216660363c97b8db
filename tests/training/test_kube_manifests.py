"""`stoke train render` output is complete: it loads into the official kubernetes client models
(strict pydantic models in kubernetes >= 37: an unquoted quantity is an error) and back to the
same JSON (so no field was unknown to them and dropped),
every container has a command and resource requests, spot workers select and tolerate spot
capacity, and every pod's TF_CONFIG, computed by the real /bin/sh prelude, names that pod.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import yaml
from kubernetes.client import V1Service, V1StatefulSet

from stoke.cli import main
from training.kube import render_manifests, validate_manifests
from training.spec import TrainingPlan

MODELS = {"Service": V1Service, "StatefulSet": V1StatefulSet}


def _plan(strategy: str = "spot") -> TrainingPlan:
    return TrainingPlan(
        strategy=strategy,
        job="resnet110-cifar",
        feasible=True,
        counts=(("p3.2xlarge", 2), ("g4dn.4xlarge", 0), ("g3.8xlarge", 3)),
        ps_type="m5.xlarge",
        ps_count=2,
        predicted_time_s=1884.0,
        predicted_cost=1.68,
        deadline_s=1900,
        target_loss=0.9,
    )


def _render(plan: TrainingPlan, **kw):
    return render_manifests(
        plan,
        gpus_per_type={"p3.2xlarge": 1, "g3.8xlarge": 2},
        vcpus_per_type={"p3.2xlarge": 8, "g3.8xlarge": 32, "m5.xlarge": 4},
        **kw,
    )


def _load(objects):
    """Each object as the kubernetes client model of its kind, which must give back the same JSON."""
    models = []
    for o in objects:
        model = MODELS[o["kind"]].from_dict(o)  # pydantic ValidationError on a wrong type
        assert json.loads(model.to_json()) == o, f"{o['metadata']['name']}: a field unknown to the model was dropped"
        models.append(model)
    return models


def test_every_object_loads_into_the_kubernetes_models_with_what_it_needs_to_run():
    objects = _render(_plan())
    assert validate_manifests(objects) == []
    models = _load(objects)
    sets = {m.metadata.name: m for m in models if isinstance(m, V1StatefulSet)}
    assert set(sets) == {"resnet110-cifar-ps", "resnet110-cifar-worker-p3-2xlarge", "resnet110-cifar-worker-g3-8xlarge"}
    for name, sts in sets.items():
        assert sts.spec.selector.match_labels.items() <= sts.spec.template.metadata.labels.items()
        pod = sts.spec.template.spec
        [container] = pod.containers
        assert container.command[:2] == ["/bin/sh", "-c"] and container.args, name
        assert container.resources.requests["cpu"] and container.resources.requests["memory"] == "8Gi"
        assert pod.node_selector["node.kubernetes.io/instance-type"] in ("m5.xlarge", "p3.2xlarge", "g3.8xlarge")
    g3 = sets["resnet110-cifar-worker-g3-8xlarge"].spec.template.spec
    assert g3.containers[0].resources.requests == {"cpu": "31", "memory": "8Gi", "nvidia.com/gpu": "2"}
    assert g3.containers[0].resources.limits == {"memory": "8Gi", "nvidia.com/gpu": "2"}
    assert g3.node_selector == {"node.kubernetes.io/instance-type": "g3.8xlarge", "karpenter.sh/capacity-type": "spot"}
    assert {(t.key, t.operator, t.effect) for t in g3.tolerations} == {
        ("karpenter.sh/capacity-type", "Exists", "NoSchedule"),
        ("nvidia.com/gpu", "Exists", "NoSchedule"),
    }
    ps = sets["resnet110-cifar-ps"].spec.template.spec
    assert ps.containers[0].args[:2] == ["python", "-c"] and "tf.distribute.Server" in ps.containers[0].args[2]
    assert ps.containers[0].resources.requests == {"cpu": "3", "memory": "8Gi"} and ps.tolerations is None
    assert "karpenter.sh/capacity-type" not in ps.node_selector  # PS stay off spot capacity
    assert (
        ps.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution[0].topology_key
        == "kubernetes.io/hostname"
    )
    worker = sets["resnet110-cifar-worker-p3-2xlarge"].spec.template.spec.containers[0]
    assert worker.args == ["python", "train.py"]
    services = [m for m in models if isinstance(m, V1Service)]
    assert all(s.spec.cluster_ip == "None" and s.spec.publish_not_ready_addresses for s in services)


def test_unquoted_quantities_and_unknown_fields_are_rejected_by_the_models():
    from pydantic import ValidationError

    objects = _render(_plan())
    broken = json.loads(json.dumps(objects[3]))
    broken["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
    with pytest.raises(ValidationError, match="nvidia.com/gpu"):
        V1StatefulSet.from_dict(broken)
    assert any("quoted quantity" in p for p in validate_manifests([objects[2], broken]))
    broken = json.loads(json.dumps(objects[3]))
    broken["spec"]["template"]["spec"]["containers"][0]["comand"] = ["typo"]
    with pytest.raises(AssertionError, match="unknown to the model"):
        _load([broken])


def _tf_config(container, pod_name: str) -> dict:
    """Run the container's /bin/sh prelude with its env, the pod's name and a program that prints TF_CONFIG."""
    env = {e.name: e.value for e in container.env if e.value is not None}
    env.update(POD_NAME=pod_name, PATH=os.environ["PATH"])
    probe = [sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"]
    out = subprocess.run([*container.command, *probe], env=env, capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


def test_each_pod_gets_its_own_tf_config():
    sets = [m for m in _load(_render(_plan())) if isinstance(m, V1StatefulSet)]
    tasks = {}
    for sts in sets:
        container = sts.spec.template.spec.containers[0]
        for ordinal in range(sts.spec.replicas):
            pod = f"{sts.metadata.name}-{ordinal}"
            config = _tf_config(container, pod)
            task = (config["task"]["type"], config["task"]["index"])
            assert task not in tasks, (pod, tasks)
            tasks[task] = pod
            host = config["cluster"][task[0]][task[1]]
            assert host == f"{pod}.{sts.spec.service_name}.default.svc:2222"  # the task's address is its own
    assert sorted(tasks) == [("ps", 0), ("ps", 1)] + [("worker", i) for i in range(5)]


def test_homogeneous_plans_and_spot_label_none_select_no_spot_capacity():
    for objects in (_render(_plan("homogeneous")), _render(_plan(), spot_label=None)):
        for m in _load(objects):
            if isinstance(m, V1StatefulSet):
                pod = m.spec.template.spec
                assert "karpenter.sh/capacity-type" not in pod.node_selector
                assert all(t.key == "nvidia.com/gpu" for t in pod.tolerations or [])


def test_cli_render_options_and_errors(tmp_path, capsys):
    target = tmp_path / "k8s.yaml"
    assert (
        main(
            [
                "train",
                "render",
                "-o",
                str(target),
                "--command",
                "python /app/train.py --epochs 3",
                "--memory",
                "24Gi",
                "--spot-label",
                "eks.amazonaws.com/capacityType=SPOT",
            ]
        )
        == 0
    )
    docs = list(yaml.safe_load_all(target.read_text()))
    models = _load(docs)
    workers = [m for m in models if isinstance(m, V1StatefulSet) and "worker" in m.metadata.name]
    assert workers and all(
        w.spec.template.spec.containers[0].args == ["python", "/app/train.py", "--epochs", "3"] for w in workers
    )
    assert all(w.spec.template.spec.node_selector["eks.amazonaws.com/capacityType"] == "SPOT" for w in workers)
    assert all(w.spec.template.spec.containers[0].resources.limits["memory"] == "24Gi" for w in workers)
    capsys.readouterr()
    for argv, message in (
        (["--spot-label", "spot"], "--spot-label 'spot': give KEY=VALUE"),
        (["--command", ""], "--command is empty"),
        (["--memory", "lots"], "--memory 'lots': give a Kubernetes quantity such as 8Gi"),
        (["--memory", "8GB"], "--memory '8GB': give a Kubernetes quantity such as 8Gi"),
        (["--memory", "512m"], "--memory '512m': the suffix m means thousandths of a byte"),
        (["--memory", "0"], "--memory '0': give a quantity above 0"),
        (["--namespace", "Bad_NS"], "--namespace 'Bad_NS' is not a Kubernetes name"),
        (["--image", "bad image"], "--image 'bad image' holds a space"),
        (["--spot-label", "a b=spot"], "--spot-label 'a b=spot': the key must be a label key"),
        (["--spot-label", "k=a b"], "--spot-label 'k=a b': the value must be a label value"),
    ):
        assert main(["train", "render", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("job", "counts", "message"),
    [
        ("a_b", (("p3.2xlarge", 1),), "job name 'a_b' is not a Kubernetes name (a DNS label"),
        ("ResNet", (("p3.2xlarge", 1),), "rename job.name in the spec, e.g. 'resnet', and re-plan"),
        ("job", (("a.b", 1), ("a-b", 1)), "instance types 'a.b' and 'a-b' give the same Kubernetes name 'worker-a-b'"),
        ("job", (("a_b", 1),), "instance type 'a_b' gives no Kubernetes name"),
        ("j" * 40, (("p3.2xlarge", 1),), "over the 52 a StatefulSet's pods can carry; shorten job.name"),
    ],
)
def test_names_that_give_no_kubernetes_name_are_refused_not_mangled(job, counts, message):
    """`a_b` and `a.b` used to be both rendered as `a-b`: one job's objects replaced the other's."""
    from training.models import TrainingError

    plan = dataclasses.replace(_plan(), job=job, counts=counts)
    with pytest.raises(TrainingError) as err:
        _render(plan)
    assert message in str(err.value)


def test_cli_render_refuses_a_plan_whose_job_gives_no_kubernetes_name(tmp_path, capsys):
    from training.spec import training_plan_to_dict

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(training_plan_to_dict(dataclasses.replace(_plan(), job="a_b"))))
    assert main(["train", "render", str(path)]) == 2
    err = capsys.readouterr().err
    assert "job name 'a_b' is not a Kubernetes name" in err and err.count("\n") == 1
    # a plan's job is a cluster's tag, any printable text (an earlier stoke took any name): render refuses what
    # Kubernetes cannot take, and the plan reader what cannot be printed
    path.write_text(json.dumps(training_plan_to_dict(dataclasses.replace(_plan(), job="ResNet 110 (run 2)"))))
    assert main(["train", "render", str(path)]) == 2
    assert "job name 'ResNet 110 (run 2)' is not a Kubernetes name" in capsys.readouterr().err
    path.write_text(json.dumps(training_plan_to_dict(dataclasses.replace(_plan(), job="a/b\x1b[31mX"))))
    assert main(["train", "render", str(path)]) == 2
    err = capsys.readouterr().err
    assert "job must be printable text" in err and "\x1b" not in err

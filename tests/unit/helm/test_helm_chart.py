"""The Helm chart in helm/delayq: lint, every rendered manifest validated offline, and what a cluster relies on.

helm is in no Debian or PyPI package: the first test to run builds it once with ``go install`` from the Go
module proxy, at a pinned version, into the delayq cache folder (``$DELAYQ_CACHE_DIR``, else
``~/.cache/delayq``). A cold build takes a few minutes; afterwards every test here takes well under a second,
except the one marked integration, which runs the chart's containers against the real Kafka and ZooKeeper.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

import confluent_kafka
import kubernetes_validate
import pytest
import yaml
from confluent_kafka.admin import AdminClient
from pydantic import SecretStr

from delayq import Settings
from delayq.dev import cache_dir

# The first test to run may build helm (minutes, once per machine); the checks themselves take milliseconds.
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "helm" / "delayq"
RELEASE = "dq"
NAMESPACE = "delayq-test"

HELM_VERSION = "v3.22.0"
HELM_PACKAGE = "helm.sh/helm/v3/cmd/helm"
# Release builds stamp the version and the client-go Kubernetes version (k8s.io/client-go v0.37 in v3.22.0)
# in at link time; without them `helm version` says "v3.22" and `helm template` assumes Kubernetes 1.20.
HELM_LDFLAGS = " ".join((
    "-s -w",
    f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
    "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
    "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37",
))

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest kubernetes-validate bundles.
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Prometheus Operator kinds: no schema is bundled for them, their structure is asserted below.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

REQUIRED = {"kafka": {"bootstrapServers": "kafka:9092"}, "zookeeper": {"connect": "zk:2181"}}
# Every optional branch of the templates at once: chart-made Secret, mutual TLS, extra settings and librdkafka
# settings (numbers from a values file arrive as floats), reconcile report, continuous reconciliation on an existing
# checkpoint claim, no PVC, existing ServiceAccount, the console on the nodes and in a Deployment of its own (its own
# Kafka user, its index on an emptyDir, a token login, an Ingress for any host).
EVERYTHING = {
    "image": {"digest": "sha256:" + "ab" * 32, "pullSecrets": ["regcred"]},
    "kafka": {
        "bootstrapServers": "kafka-0:9093,kafka-1:9093",
        "securityProtocol": "SASL_SSL",
        "sasl": {"mechanism": "SCRAM-SHA-256", "username": "delayq", "password": "s3cret"},
        "tls": {"existingSecret": "kafka-tls", "certKey": "tls.crt", "keyKey": "tls.key"},
        "extraConfig": {"message.max.bytes": 2000000, "socket.keepalive.enable": True, "client.rack": "zone-a"},
    },
    "zookeeper": {"connect": "zk-0:2181,zk-1:2181", "auth": {"enabled": True, "credentials": "delayq:pw"}},
    "config": {
        "cluster": "orders", "bufferTopic": "orders-buffer", "deadLetterTopic": "orders-dead",
        "extraSettings": {"max_delay_ms": 86400000, "lookup_urls": ["http://a:8080", "http://b:8080"]},
        "dispatchLimits": {"orders": {"rate": 500, "burst": 1000}, "audit.*": {"rate": 2.5}},
        "targetTopics": ["orders*", "audit.*", "payments"],
    },
    "extraEnvVars": [{"name": "TZ", "value": "UTC"}],
    "persistence": {"enabled": False},
    "persistentVolumeClaimRetentionPolicy": {"enabled": True, "whenScaled": "Delete"},
    "serviceAccount": {"create": False, "name": "delayq-sa"},
    "podAntiAffinityPreset": "none",
    "commonAnnotations": {"team": "platform"},
    "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Kafka"}}},
    "reconcile": {"enabled": True, "reports": {"existingClaim": "delayq-reports"}, "extraArgs": ["--days", "7"],
                  "follow": {"enabled": True, "findingsTopic": "orders-findings", "metricsPort": 9500, "trigger": 2.5,
                             "grace": "90s", "extraArgs": ["--retain", "2h"],
                             "checkpoint": {"existingClaim": "delayq-checkpoint"}}},
    "console": {"enabled": True, "actions": {"enabled": True},
                "auth": {"existingSecret": "console-login", "userKey": "", "passwordKey": "", "tokenKey": "token"},
                "deployment": {"enabled": True, "port": 9090, "kafka": {"sasl": {"username": "delayq-console",
                                                                                 "password": "c0nsole"}},
                               "persistence": {"enabled": False}, "service": {"port": 80},
                               "ingress": {"enabled": True, "className": "nginx", "path": "/"}}},
}
# A cluster locked down as the secured dev stack is: SASL_SSL with SCRAM-SHA-512 and the chart's own Secret, the CA
# under a key name of its own (not the default ca.crt), ZooKeeper digest auth, and a target-topic allowlist. The
# reconcile CronJob, the continuous reconciliation and the console (on the nodes, and its own pod as its own Kafka
# user, with actions behind a login) are on so that every kind of delayq container is rendered.
SECURED_KAFKA_PASSWORD = "kafka-Pa55-7f3e"
SECURED_CONSOLE_PASSWORD = "console-Pa55-93d0"
SECURED_ZK_CREDENTIALS = "delayq-zk:zk-Pa55-41c9"
SECURED = {
    "kafka": {
        "bootstrapServers": "kafka-0:9093",
        "securityProtocol": "SASL_SSL",
        "sasl": {"mechanism": "SCRAM-SHA-512", "username": "delayq-node", "password": SECURED_KAFKA_PASSWORD},
        "tls": {"existingSecret": "kafka-broker-ca", "caKey": "broker-ca.pem"},
    },
    "zookeeper": {"connect": "zk-0:2181", "auth": {"enabled": True, "credentials": SECURED_ZK_CREDENTIALS}},
    "config": {"targetTopics": ["orders*", "audit"]},
    "reconcile": {"enabled": True, "follow": {"enabled": True}},
    "console": {"enabled": True, "actions": {"enabled": True}, "auth": {"existingSecret": "delayq-console"},
                "deployment": {"enabled": True,
                               "kafka": {"sasl": {"username": "delayq-console", "password": SECURED_CONSOLE_PASSWORD}}}},
}
VALUE_SETS = ("default", "production", "everything", "secured")
# The console's Deployment (and Service, Ingress, index claim), and the variables of its login.
CONSOLE = f"{RELEASE}-delayq-console"
CONSOLE_LOGIN_VARIABLES = ("DELAYQ_CONSOLE_USER", "DELAYQ_CONSOLE_PASSWORD", "DELAYQ_CONSOLE_TOKEN",
                           "DELAYQ_CONSOLE_SECRET_KEY")


# --- helm, built once -------------------------------------------------------------------------------------


def ensure_helm(say=print) -> Path:
    """The helm binary at HELM_VERSION, built with ``go install`` from the Go module proxy on first use.

    Args:
        say: receives progress lines (a cold build takes minutes).

    Raises:
        RuntimeError: Go is not installed, or the build failed; the message says which and how to fix it.
    """
    helm = cache_dir() / f"helm-{HELM_VERSION}" / "helm"
    if helm.is_file():
        return helm
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(
            f"helm {HELM_VERSION} is built from the Go module proxy and Go was not found: install Go 1.26+ "
            "(https://go.dev/dl/) or put an official helm binary at " + str(helm)
        )
    # A private GOBIN, moved into place at the end: an interrupted or concurrent build never leaves half a binary.
    staging = helm.parent / f".build-{os.getpid()}"
    staging.mkdir(parents=True, exist_ok=True)
    say(f"building helm {HELM_VERSION} with `go install {HELM_PACKAGE}@{HELM_VERSION}` into {helm.parent} "
        "(once; a cold build takes a few minutes)")
    started = time.monotonic()
    proc = subprocess.Popen(
        [go, "install", "-trimpath", "-ldflags", HELM_LDFLAGS, f"{HELM_PACKAGE}@{HELM_VERSION}"],
        env={**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    while True:
        try:
            proc.wait(timeout=20)
            break
        except subprocess.TimeoutExpired:
            downloaded = sum(line.startswith("go: downloading") for line in output)
            say(f"  still building helm: {time.monotonic() - started:.0f} s, {downloaded} modules downloaded")
    reader.join()
    built = staging / "helm"
    if proc.returncode != 0 or not built.is_file():
        shutil.rmtree(staging, ignore_errors=True)
        tail = "".join(output[-30:])
        raise RuntimeError(f"`go install {HELM_PACKAGE}@{HELM_VERSION}` failed (exit {proc.returncode}):\n{tail}")
    os.replace(built, helm)
    shutil.rmtree(staging, ignore_errors=True)
    say(f"helm {HELM_VERSION} built in {time.monotonic() - started:.0f} s: {helm}")
    return helm


@pytest.fixture(scope="session")
def helm(request) -> Path:
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def say(text: str) -> None:
        # Shown live even under output capture: a silent multi-minute build looks like a hang.
        with capture.global_and_fixture_disabled():
            print(text, flush=True)

    try:
        return ensure_helm(say)
    except RuntimeError as err:
        pytest.fail(str(err), pytrace=False)


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def values_args(values: dict | None, tmp_path: Path, name: str) -> list[str]:
    if values is None:
        return []
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return ["-f", str(path)]


def template(helm: Path, *args: str, kube_version: str = KUBE_VERSIONS[0]) -> list[dict]:
    """Every manifest ``helm template`` renders (hooks and test pods included), parsed."""
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                      "--kube-version", kube_version, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="session")
def value_args(tmp_path_factory) -> dict[str, list[str]]:
    folder = tmp_path_factory.mktemp("values")
    return {
        "default": values_args(REQUIRED, folder, "default"),
        "production": ["-f", str(CHART / "values-production.yaml")],
        "everything": values_args(EVERYTHING, folder, "everything"),
        "secured": values_args(SECURED, folder, "secured"),
    }


@pytest.fixture(scope="session")
def rendered(helm, value_args) -> dict[str, list[dict]]:
    return {name: template(helm, *args) for name, args in value_args.items()}


# --- reading the rendered manifests ---------------------------------------------------------------------------


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def the(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [doc for doc in of_kind(docs, kind) if name is None or doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def hook(doc: dict) -> set[str]:
    return set(filter(None, doc["metadata"].get("annotations", {}).get("helm.sh/hook", "").split(",")))


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    """Pod spec of every workload, by "Kind/name"."""
    specs = {}
    for doc in docs:
        spec = {
            "StatefulSet": lambda d: d["spec"]["template"]["spec"],
            "Deployment": lambda d: d["spec"]["template"]["spec"],
            "Job": lambda d: d["spec"]["template"]["spec"],
            "CronJob": lambda d: d["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            "Pod": lambda d: d["spec"],
        }.get(doc["kind"])
        if spec:
            specs[f"{doc['kind']}/{doc['metadata']['name']}"] = spec(doc)
    return specs


def node_container(docs: list[dict]) -> dict:
    return the(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]


def container_env(docs: list[dict], container: dict, pod_name: str) -> dict[str, str]:
    """The environment Kubernetes gives ``container``: envFrom ConfigMaps, then env (fieldRef, Secret keys)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(the(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]
        if "fieldRef" in ref:
            assert ref["fieldRef"]["fieldPath"] == "metadata.name", var
            env[var["name"]] = pod_name
        else:
            key = ref["secretKeyRef"]
            secrets = [s for s in of_kind(docs, "Secret") if s["metadata"]["name"] == key["name"]]
            # An existingSecret is not rendered: stand in a value ("user:password"-shaped, as the ZooKeeper
            # credentials must be) so the variable is still checked.
            env[var["name"]] = secrets[0]["stringData"][key["key"]] if secrets else f"{key['name']}:{key['key']}"
    return env


def delayq_containers(docs: list[dict]) -> list[tuple[str, dict, dict[str, str]]]:
    """(workload, container, environment) of every container the chart runs."""
    found = []
    for owner, spec in pod_specs(docs).items():
        pod_name = f"{owner.split('/', 1)[1]}-0"
        for container in spec["containers"]:
            found.append((owner, container, container_env(docs, container, pod_name)))
    return found


def load_settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The real settings model over exactly ``env``: this machine's own DELAYQ_ variables are cleared first."""
    for name in [name for name in os.environ if name.startswith("DELAYQ_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def secret_key_at(pod_spec: dict, container: dict, path: str) -> tuple[str, str] | None:
    """(Secret name, key) of the file Kubernetes puts at ``path`` in ``container``; None if no Secret volume has it.

    A Secret volume shows every key as a file of its name, or only its ``items``, each at its own ``path``;
    a mount with a ``subPath`` shows that part of the volume only.
    """
    volumes = {volume["name"]: volume for volume in pod_spec.get("volumes", [])}
    target = PurePosixPath(path)
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")
        mount_path = PurePosixPath(mount["mountPath"])
        if secret is None or (target != mount_path and mount_path not in target.parents):
            continue
        file = str(PurePosixPath(mount.get("subPath", ""), target.relative_to(mount_path)))
        if "items" in secret:
            keys = [item["key"] for item in secret["items"] if item["path"] == file]
            return (secret["secretName"], keys[0]) if keys else None
        # Without items each key is a file at the volume's top (a key holds no '/').
        return (secret["secretName"], file) if file != "." and "/" not in file else None
    return None


def dockerfile_instruction(name: str, stage: str | None = None) -> list[str]:
    """The JSON-form argument of the last ``name`` instruction (ENTRYPOINT, CMD), in ``stage`` or its bases."""
    stages: dict[str, tuple[str | None, list[str]]] = {}
    current = None
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        match = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match:
            current = match.group(2)
            stages[current] = (match.group(1), [])
        elif current:
            stages[current][1].append(line)
    stage = stage or current
    while stage in stages:
        base, lines = stages[stage]
        for line in reversed(lines):
            if line.startswith(f"{name} "):
                return json.loads(line[len(name) + 1:])
        stage = base
    raise AssertionError(f"no {name} in Dockerfile stage {stage}")


def container_argv(container: dict) -> list[str]:
    """What the container runs: command replaces the image's ENTRYPOINT, args its CMD (Kubernetes' rules)."""
    if "command" in container:
        return container["command"] + container.get("args", [])
    return dockerfile_instruction("ENTRYPOINT") + container.get("args", dockerfile_instruction("CMD"))


def librdkafka_refuses(name: str, value: str) -> str | None:
    """librdkafka's complaint about one property, None when it knows the name and accepts the value."""
    try:
        # Creating a client checks the configuration without connecting (no bootstrap servers).
        confluent_kafka.Producer({name: value, "log_level": 0})
    except confluent_kafka.KafkaException as err:
        text = str(err)
        if "No such configuration property" in text or "Invalid value" in text:
            return text
    return None


# --- lint and schema ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS)
def test_helm_lint_passes(helm, value_args, values):
    result = run_helm(helm, "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSIONS[0], *value_args[values])

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_helm_lint_of_the_bare_chart_passes_and_names_the_required_values(helm):
    result = run_helm(helm, "lint", str(CHART), "--strict")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "kafka.bootstrapServers is required" in result.stderr
    assert "zookeeper.connect is required" in result.stderr


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_rendered_manifest_is_valid_for_kubernetes(helm, value_args, values, kube_version):
    docs = template(helm, *value_args[values], kube_version=kube_version)

    checked = []
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} is invalid for Kubernetes {kube_version}: {err}")
        checked.append(doc["kind"])
    assert {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "Job", "Pod"} <= set(checked)


def test_production_values_render_the_prometheus_operator_objects(rendered):
    kinds = {doc["kind"] for doc in rendered["production"]}

    assert kinds >= CRD_KINDS
    assert not CRD_KINDS & {doc["kind"] for doc in rendered["default"]}


@pytest.mark.parametrize("missing,sets", [
    ("kafka.bootstrapServers", ["zookeeper.connect=zk:2181"]),
    ("zookeeper.connect", ["kafka.bootstrapServers=kafka:9092"]),
])
def test_a_missing_required_value_is_named_with_its_set_fix(helm, missing, sets):
    result = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSIONS[0],
                      *[arg for value in sets for arg in ("--set", value)])

    assert result.returncode != 0
    assert f"{missing} is required" in result.stderr
    assert f"--set {missing}=" in result.stderr


@pytest.mark.parametrize("sets,message", [
    (["kafka.securityProtocol=SASL_SSL"],
     "kafka.sasl.username is required with kafka.securityProtocol=SASL_SSL: --set kafka.sasl.username="),
    (["kafka.securityProtocol=SASL_SSL", "kafka.sasl.username=u"],
     "--set kafka.sasl.password=PASSWORD, or name a Secret holding it with --set auth.existingSecret="),
    (["zookeeper.auth.enabled=true"], "--set zookeeper.auth.credentials=USER:PASSWORD"),
    (["zookeeper.connect=zk:2181/chroot"], "zookeeper.connect \"zk:2181/chroot\" must not carry a chroot"),
    (["kafka.tls.existingSecret=ca"], "--set kafka.securityProtocol=SSL"),
    (["kafka.extraConfig.client_rack=a"], "kafka.extraConfig key \"client_rack\": use librdkafka's dotted"),
    (["kafka.extraConfig.sasl\\.password=pw"], "kafka.extraConfig.sasl.password is set through the chart's own values"),
    (["kafka.extraConfig.security\\.protocol=SSL"], "kafka.extraConfig.security.protocol is set through"),
    (["config.extraSettings.http_port=1"], "config.extraSettings.http_port is set by the chart itself"),
    (["config.extraSettings.Max=1"], "config.extraSettings key \"Max\": use the settings field name in snake_case"),
    (["podAntiAffinityPreset=medium"], "podAntiAffinityPreset"),
    (["replicaCount=0"], "replicaCount"),
    (["replicas=3"], "additional properties 'replicas' not allowed"),
    (["config.shards=5"], "config.bufferPartitions=12 must be a multiple of config.shards=5"),
    (["config.shards=24"], "config.bufferPartitions=12 must be a multiple of config.shards=24"),
    (["config.shards=8", "config.bufferPartitions=12"],
     "--set config.shards=N with N one of 1, 2, 3, 4, 6, 12, or (for a buffer topic not yet created) "
     "e.g. --set config.bufferPartitions=16"),
    (["config.replicas=4"], "config.replicas=4 is more than replicaCount=3"),
    (["config.replicas=2", "replicaCount=1"], "--set config.replicas=1 (or 0: every node holds every shard), "
                                              "or --set replicaCount=2"),
    (["config.shards=0"], "/config/shards"),
    (["config.shards=1025"], "/config/shards"),
    (["config.replicas=-1"], "/config/replicas"),
    (["config.processes=0"], "/config/processes"),
    (["config.extraSettings.shards=2"], "config.extraSettings.shards is set by the chart itself"),
    (["config.extraSettings.replicas=2"], "config.extraSettings.replicas is set by the chart itself"),
    (["config.targetTopics={orders/eu}"], "/config/targetTopics/0"),
    (["config.targetTopics={orders,pay ments}"], "/config/targetTopics/1"),
    (["config.extraSettings.target_topics=orders"], "--set 'config.targetTopics={orders*,payments}'"),
    (["config.targetTopics={orders}", "config.extraSettings.target_topics=orders"],
     "config.extraSettings.target_topics is set by the chart itself"),
    (["reconcile.follow.trigger=0"], "/reconcile/follow/trigger"),
    (["reconcile.follow.trigger=3601"], "/reconcile/follow/trigger"),
    (["reconcile.follow.metricsPort=0"], "/reconcile/follow/metricsPort"),
    (["reconcile.follow.grace=5 minutes"], "/reconcile/follow/grace"),
    (["reconcile.follow.replicas=2"], "additional properties 'replicas' not allowed"),
    (["reconcile.follow.checkpoint.accessModes={ReadOnlyMany}"], "/reconcile/follow/checkpoint/accessModes/0"),
    (["reconcile.reports.url=http://minio:9000/bucket"], "/reconcile/reports/url"),
    (["reconcile.reports.url=s3://bucket/prefix?region=eu-west-1"], "/reconcile/reports/url"),
    (["reconcile.reports.url=s3://bucket/delayq", "reconcile.reports.existingClaim=reports"],
     "both say where the reports go: keep one, e.g. --set reconcile.reports.existingClaim="),
    (["reconcile.reports.credentialsSecret=s3"], "--set reconcile.reports.url=s3://BUCKET/PREFIX"),
    (["reconcile.reports.endpoint=http://minio:9000"], "--set reconcile.reports.url=s3://BUCKET/PREFIX"),
    (["metrics.prometheusRule.reconcileStalledMinutes=0"], "/metrics/prometheusRule/reconcileStalledMinutes"),
    (["console.actions.enabled=true"], "console.actions.enabled=true lets whoever reaches the console cancel, "
                                       "reschedule and replay: it needs a login, --set console.auth.existingSecret="),
    (["console.actions.enabled=true", "console.deployment.enabled=true"], "--set console.auth.existingSecret=NAME"),
    (["console.auth.existingSecret=login", "console.auth.passwordKey="],
     "console.auth.userKey and console.auth.passwordKey go together"),
    (["console.actions.enabled=true", "console.auth.existingSecret=login", "console.auth.userKey=",
      "console.auth.passwordKey="], "needs a way to log in: --set console.auth.userKey=user,console.auth.passwordKey="),
    (["console.deployment.enabled=true", "console.deployment.kafka.sasl.username=c"],
     "console.deployment.kafka.sasl.username is set but kafka.securityProtocol=PLAINTEXT does not use SASL"),
    (["console.deployment.enabled=true", "console.deployment.kafka.sasl.username=c", "kafka.securityProtocol=SASL_SSL",
      "kafka.sasl.username=n", "kafka.sasl.password=p"],
     "console.deployment.kafka.sasl.password is required with console.deployment.kafka.sasl.username=c: --set "
     "console.deployment.kafka.sasl.password=PASSWORD, or put it under the key console-kafka-sasl-password of"),
    (["console.deployment.ingress.enabled=true", "console.deployment.ingress.tlsSecret=tls"],
     "--set console.deployment.ingress.host="),
    (["console.deployment.port=0"], "/console/deployment/port"),
    (["console.deployment.ingress.path=console"], "/console/deployment/ingress/path"),
    (["console.deployment.ingress.host=Delayq.Example.com:443"], "/console/deployment/ingress/host"),
    (["console.auth.userKey=a b"], "/console/auth/userKey"),
    (["console.deployment.replicas=2"], "additional properties 'replicas' not allowed"),
])
def test_bad_values_are_refused_naming_the_key(helm, sets, message):
    args = ["--set", "kafka.bootstrapServers=kafka:9092", "--set", "zookeeper.connect=zk:2181"]
    result = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSIONS[0],
                      *args, *[arg for value in sets for arg in ("--set", value)])

    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize("sets", [
    ["config.shards=12"],  # one partition per shard
    ["config.shards=4", "config.bufferPartitions=8"],
    ["config.replicas=3"],  # every node holds every shard, by name
    ["config.replicas=1", "replicaCount=1"],
    ["config.replicas=0", "replicaCount=1"],  # 0: all nodes, however few
])
def test_shards_dividing_the_partitions_and_replicas_up_to_the_node_count_are_accepted(helm, sets):
    args = ["--set", "kafka.bootstrapServers=kafka:9092", "--set", "zookeeper.connect=zk:2181"]
    result = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSIONS[0],
                      *args, *[arg for value in sets for arg in ("--set", value)])

    assert result.returncode == 0, result.stderr


# --- what the nodes rely on -----------------------------------------------------------------------------------


@pytest.mark.parametrize("values,shards,replicas,processes", [
    ("default", "1", "0", "1"),
    ("production", "6", "2", "1"),
    ("set", "4", "2", "2"),
])
def test_shards_replicas_and_processes_reach_the_node_and_init_containers(helm, value_args, values, shards, replicas,
                                                                          processes):
    if values == "set":
        docs = template(helm, *value_args["default"], "--set", "config.shards=4", "--set", "config.bufferPartitions=8",
                        "--set", "config.replicas=2", "--set", "config.processes=2")
    else:
        docs = template(helm, *value_args[values])
    init = the(docs, "Job", "dq-delayq-init")["spec"]["template"]["spec"]["containers"][0]

    for container, pod_name in ((node_container(docs), "dq-delayq-0"), (init, "dq-delayq-init-x")):
        env = container_env(docs, container, pod_name)
        assert env["DELAYQ_SHARDS"] == shards, container["name"]
        assert env["DELAYQ_REPLICAS"] == replicas, container["name"]
        assert env["DELAYQ_PROCESSES"] == processes, container["name"]


def test_statefulset_has_one_pvc_template_per_pod_mounted_at_the_data_dir(rendered):
    docs = rendered["default"]
    sts = the(docs, "StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    env = container_env(docs, container, "dq-delayq-0")

    claims = sts["spec"]["volumeClaimTemplates"]
    assert [claim["metadata"]["name"] for claim in claims] == ["data"]
    assert claims[0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claims[0]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts["data"] == env["DELAYQ_DATA_DIR"] == "/data"
    assert "data" not in {volume["name"] for volume in sts["spec"]["template"]["spec"]["volumes"]}
    assert sts["spec"]["replicas"] == 3


def test_persistence_disabled_puts_the_store_on_an_empty_dir(rendered):
    spec = the(rendered["everything"], "StatefulSet")["spec"]

    assert "volumeClaimTemplates" not in spec
    assert {"name": "data", "emptyDir": {}} in spec["template"]["spec"]["volumes"]


def test_node_id_is_the_pod_name_and_http_listens_on_all_interfaces(rendered):
    docs = rendered["default"]
    container = node_container(docs)
    env = container_env(docs, container, "dq-delayq-2")

    assert env["DELAYQ_NODE_ID"] == "dq-delayq-2"
    assert env["DELAYQ_HTTP_HOST"] == "0.0.0.0"
    assert container_argv(container) == ["delayq", "node"]


@pytest.mark.parametrize("values", VALUE_SETS)
def test_probes_point_at_the_paths_and_port_the_node_serves(rendered, values):
    docs = rendered[values]
    container = node_container(docs)
    env = container_env(docs, container, "dq-delayq-0")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}

    paths = {}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert ports[get["port"]] == int(env["DELAYQ_HTTP_PORT"]), probe
        paths[probe] = get["path"]
    assert paths == {"startupProbe": "/readyz", "readinessProbe": "/readyz", "livenessProbe": "/livez"}


@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_delayq_variable_the_chart_sets_is_a_settings_field(rendered, values):
    names = {name for cm in of_kind(rendered[values], "ConfigMap") for name in cm["data"]}
    names |= {var["name"] for _, container, _ in delayq_containers(rendered[values])
              for var in container.get("env", [])}
    names = {name for name in names if name.startswith("DELAYQ_")}

    unknown = []
    for name in sorted(names):
        if name.startswith("DELAYQ_KAFKA__"):
            continue  # librdkafka's own names: the next test asks librdkafka
        # DELAYQ_CONFIG names a settings file (read by Settings itself) and is no field.
        if name != "DELAYQ_CONFIG" and name.removeprefix("DELAYQ_").lower() not in Settings.model_fields:
            unknown.append(name)
    assert not unknown, f"the chart sets variables no Settings field reads: {unknown}"
    assert {"DELAYQ_BOOTSTRAP_SERVERS", "DELAYQ_ZK_CONNECT", "DELAYQ_NODE_ID", "DELAYQ_DATA_DIR"} <= names


@pytest.mark.parametrize("values", VALUE_SETS)
def test_the_rendered_environment_loads_into_the_settings_model(rendered, values, monkeypatch):
    for owner, _container, env in delayq_containers(rendered[values]):
        settings = load_settings(env, monkeypatch)
        loaded = settings.model_dump(mode="json")
        loaded["kafka"] = settings.kafka_passthrough()  # secrets revealed, to compare with what the chart set
        loaded["zk_auth"] = settings.zk_credentials

        for name, value in env.items():
            if name.startswith("DELAYQ_KAFKA__"):
                key = name.removeprefix("DELAYQ_KAFKA__").lower().replace("_", ".")
                assert loaded["kafka"][key] == value, (owner, name)
                assert librdkafka_refuses(key, value) is None, (owner, name, librdkafka_refuses(key, value))
            elif name.startswith("DELAYQ_"):
                field = name.removeprefix("DELAYQ_").lower()
                expected = json.loads(value) if value.startswith(("[", "{")) else value
                if field == "dispatch_limits":  # a map of models: compared as the model reads it
                    expected = {topic: {"burst": None, **limit} for topic, limit in expected.items()}
                    assert loaded[field] == expected, (owner, name)
                    continue
                if field == "target_topics":  # comma-separated in the environment, a list in the model
                    assert loaded[field] == value.split(","), (owner, name)
                    continue
                held = getattr(settings, field)
                if isinstance(held, SecretStr):  # hidden in the dump: compared revealed
                    assert held.get_secret_value() == value, (owner, name)
                    continue
                if isinstance(held, bool):
                    assert held is (value == "true"), (owner, name)
                    continue
                assert str(loaded[field]) == str(expected), (owner, name)


def test_librdkafka_check_catches_an_unknown_property():
    assert librdkafka_refuses("no.such.property", "x") is not None
    assert librdkafka_refuses("socket.keepalive.enable", "true") is None


def test_credentials_come_from_the_secret_never_the_configmap(rendered):
    docs = rendered["everything"]
    env_vars = {var["name"]: var for var in node_container(docs)["env"]}
    config = the(docs, "ConfigMap", "dq-delayq")["data"]

    for name in ("DELAYQ_KAFKA__SASL_PASSWORD", "DELAYQ_ZK_AUTH"):
        assert env_vars[name]["valueFrom"]["secretKeyRef"]["name"] == "dq-delayq"
        assert name not in config
    assert "s3cret" not in json.dumps(config) and "delayq:pw" not in json.dumps(config)
    assert the(docs, "Secret", "dq-delayq")["stringData"] == {"kafka-sasl-password": "s3cret",
                                                              "zookeeper-credentials": "delayq:pw",
                                                              "console-kafka-sasl-password": "c0nsole"}


def test_production_reads_credentials_from_the_existing_secret_and_renders_none(rendered):
    docs = rendered["production"]
    env_vars = {var["name"]: var for var in node_container(docs)["env"]}

    assert not of_kind(docs, "Secret")
    assert env_vars["DELAYQ_KAFKA__SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "delayq-credentials", "key": "kafka-sasl-password"}


def test_a_secured_release_gives_every_delayq_container_sasl_ssl_scram_the_ca_zookeeper_auth_and_target_topics(
        rendered, monkeypatch):
    docs = rendered["secured"]
    specs = pod_specs(docs)
    containers = delayq_containers(docs)

    # The node, the init hook, the reconcile report, the continuous reconciliation, the console and the helm test all
    # talk to Kafka and ZooKeeper.
    assert sorted(owner for owner, _, _ in containers) == [
        "CronJob/dq-delayq-reconcile", f"Deployment/{CONSOLE}", f"Deployment/{FOLLOW}", "Job/dq-delayq-init",
        "Pod/dq-delayq-test-one-master", "StatefulSet/dq-delayq"]
    for owner, container, env in containers:
        settings = load_settings(env, monkeypatch)
        conf = settings.kafka_conf()
        console = owner == f"Deployment/{CONSOLE}"

        assert conf["security.protocol"] == "SASL_SSL", owner
        # The chart sets librdkafka's sasl.mechanism; its alias sasl.mechanisms must not say otherwise.
        assert conf["sasl.mechanism"] == "SCRAM-SHA-512" and "sasl.mechanisms" not in conf, owner
        # The console's pod is a Kafka user of its own (`delayq acls --console`), every other container the nodes'.
        assert conf["sasl.username"] == ("delayq-console" if console else "delayq-node"), owner
        assert conf["sasl.password"] == (SECURED_CONSOLE_PASSWORD if console else SECURED_KAFKA_PASSWORD), owner
        assert secret_key_at(specs[owner], container, conf["ssl.ca.location"]) == \
            ("kafka-broker-ca", "broker-ca.pem"), (owner, conf["ssl.ca.location"])
        # The console only reads ZooKeeper, which anyone may: it gets no credentials to change it.
        assert settings.zk_credentials == (None if console else SECURED_ZK_CREDENTIALS), owner
        assert settings.target_topics == ["orders*", "audit"], owner
        assert settings.forbidden_target("orders.eu") is None, owner
        assert settings.forbidden_target("payments") is not None, owner


def test_a_secured_release_shows_its_passwords_in_no_settings_repr_and_no_configmap(rendered, monkeypatch):
    docs = rendered["secured"]
    zk_password = SECURED_ZK_CREDENTIALS.split(":", 1)[1]
    secrets = (SECURED_KAFKA_PASSWORD, SECURED_CONSOLE_PASSWORD, zk_password)

    for owner, _container, env in delayq_containers(docs):
        settings = load_settings(env, monkeypatch)
        # Loaded for real: the values are there, only hidden.
        assert settings.kafka_passthrough()["sasl.password"] in (SECURED_KAFKA_PASSWORD, SECURED_CONSOLE_PASSWORD)
        assert settings.zk_credentials in (SECURED_ZK_CREDENTIALS, None), owner
        if "DELAYQ_CONSOLE_PASSWORD" in env:  # the console's login, from its Secret (a stand-in value here)
            assert settings.console_password is not None, owner
            assert settings.console_password.get_secret_value() == env["DELAYQ_CONSOLE_PASSWORD"], owner
            secrets_here = (*secrets, env["DELAYQ_CONSOLE_PASSWORD"])
        else:
            secrets_here = secrets
        shown = repr(settings) + str(settings)
        assert not [secret for secret in secrets_here if secret in shown], owner
    config_maps = of_kind(docs, "ConfigMap")
    assert [cm["metadata"]["name"] for cm in config_maps] == ["dq-delayq", "dq-delayq-init"]
    for config_map in config_maps:
        text = json.dumps(config_map)
        assert not [secret for secret in secrets if secret in text], config_map["metadata"]["name"]


def test_target_topics_are_rendered_comma_joined_and_left_out_when_empty(rendered):
    secured = the(rendered["secured"], "ConfigMap", "dq-delayq")["data"]
    default = the(rendered["default"], "ConfigMap", "dq-delayq")["data"]

    assert secured["DELAYQ_TARGET_TOPICS"] == "orders*,audit"
    # Not rendered: the node's own default, "*" (any topic), applies.
    assert "DELAYQ_TARGET_TOPICS" not in default


def test_pdb_lets_one_node_go_at_a_time_and_selects_the_nodes(rendered):
    docs = rendered["default"]
    pdb = the(docs, "PodDisruptionBudget")
    sts = the(docs, "StatefulSet")

    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == sts["spec"]["selector"]


def test_services_give_stable_names_and_reach_the_http_port(rendered):
    docs = rendered["default"]
    sts = the(docs, "StatefulSet")
    headless = the(docs, "Service", sts["spec"]["serviceName"])
    http = the(docs, "Service", "dq-delayq")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]

    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    for service in (headless, http):
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert http["spec"]["type"] == "ClusterIP"


def test_nodes_get_a_graceful_handover_and_spread_over_hosts(rendered):
    default = the(rendered["default"], "StatefulSet")["spec"]["template"]["spec"]
    production = the(rendered["production"], "StatefulSet")["spec"]["template"]["spec"]

    # The node hands leadership over within a few seconds of SIGTERM; 30 s is the least the chart accepts.
    assert default["terminationGracePeriodSeconds"] >= 30
    soft = default["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert soft[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    hard = production["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert hard[0]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "node"


@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_pod_runs_as_the_image_user_with_a_read_only_root(rendered, values):
    uid = int(re.search(r"--uid (\d+)", (ROOT / "Dockerfile").read_text()).group(1))

    for owner, spec in pod_specs(rendered[values]).items():
        assert spec["securityContext"]["runAsNonRoot"] is True, owner
        assert spec["securityContext"]["runAsUser"] == uid, owner
        # Kubernetes' service links would inject DELAYQ_<SERVICE>_PORT-style variables into the settings prefix.
        assert spec["enableServiceLinks"] is False, owner
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, owner
            assert context["allowPrivilegeEscalation"] is False, owner
            assert context["capabilities"]["drop"] == ["ALL"], owner
            assert "/tmp" in {mount["mountPath"] for mount in container["volumeMounts"]}, owner


def test_config_changes_roll_the_nodes(helm, value_args):
    before = the(template(helm, *value_args["default"]), "StatefulSet")
    after = the(template(helm, *value_args["default"], "--set", "config.deliveryBatchSize=10"), "StatefulSet")

    annotation = "checksum/config"
    assert before["spec"]["template"]["metadata"]["annotations"][annotation] != \
        after["spec"]["template"]["metadata"]["annotations"][annotation]


# --- hooks, jobs and the helm test ----------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS)
def test_the_init_hook_runs_delayq_init_before_install_and_upgrade(rendered, values):
    docs = rendered[values]
    job = the(docs, "Job", "dq-delayq-init")
    container = job["spec"]["template"]["spec"]["containers"][0]
    hook_env = container_env(docs, container, "dq-delayq-init-x")
    node_env = container_env(docs, node_container(docs), "dq-delayq-0")

    assert hook(job) == {"pre-install", "pre-upgrade"}
    assert container_argv(container) == ["delayq", "init"]
    # Pre-install hooks run before the release's ConfigMap and Secret exist: the Job reads hook copies, made first.
    config = the(docs, "ConfigMap", container["envFrom"][0]["configMapRef"]["name"])
    assert hook(config) == {"pre-install", "pre-upgrade"}
    assert int(config["metadata"]["annotations"]["helm.sh/hook-weight"]) < \
        int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    def settings(env):
        # The node's id and the login of the console it serves are the node's own; the rest is the release's.
        return {k: v for k, v in env.items() if k.startswith("DELAYQ_") and k != "DELAYQ_NODE_ID"
                and k not in CONSOLE_LOGIN_VARIABLES}

    assert settings(node_env) == settings(hook_env)


def test_the_init_hook_does_not_need_the_chart_service_account(rendered):
    spec = the(rendered["default"], "Job", "dq-delayq-init")["spec"]["template"]["spec"]

    # The chart's ServiceAccount is created after pre-install hooks, so the Job must not name it.
    assert "serviceAccountName" not in spec
    existing = pod_specs(rendered["everything"])["Job/dq-delayq-init"]
    assert existing["serviceAccountName"] == "delayq-sa"


def test_the_helm_test_pod_runs_the_one_master_check(rendered):
    docs = rendered["default"]
    pod = the(docs, "Pod")
    container = pod["spec"]["containers"][0]

    assert hook(pod) == {"test"}
    assert pod["spec"]["restartPolicy"] == "Never"
    argv = container_argv(container)
    assert argv[:2] == ["python", "-c"]
    assert argv[2] == (CHART / "files" / "check_one_master.py").read_text()
    assert argv[3] == "120"


@pytest.mark.parametrize("status,code,says", [
    ({"master": "dq-delayq-1", "nodes": [{"node_id": "dq-delayq-0", "role": "standby"},
                                         {"node_id": "dq-delayq-1", "role": "master"}]}, 0, "one master: dq-delayq-1"),
    ({"master": None, "nodes": [{"node_id": "dq-delayq-0", "role": "standby"}]}, 1, "no master"),
    ({"master": "dq-delayq-0", "nodes": [{"node_id": "dq-delayq-0", "role": "master"},
                                         {"node_id": "dq-delayq-1", "role": "master"}]}, 1, "2 nodes have role master"),
    # With shards: one master per shard, each claimed by exactly one node.
    ({"master": "dq-delayq-0",
      "shards": [{"shard": 0, "master": "dq-delayq-0"}, {"shard": 1, "master": "dq-delayq-1"}],
      "nodes": [{"node_id": "dq-delayq-0", "role": "master", "masters": [0]},
                {"node_id": "dq-delayq-1", "role": "master", "masters": [1]}]},
     0, "one master per shard: 0 dq-delayq-0, 1 dq-delayq-1"),
    ({"master": "dq-delayq-0",
      "shards": [{"shard": 0, "master": "dq-delayq-0"}, {"shard": 1, "master": None}],
      "nodes": [{"node_id": "dq-delayq-0", "role": "master", "masters": [0]}]}, 1, "shard 1 has no master"),
    ({"master": "dq-delayq-0",
      "shards": [{"shard": 0, "master": "dq-delayq-0"}],
      "nodes": [{"node_id": "dq-delayq-0", "role": "master", "masters": [0]},
                {"node_id": "dq-delayq-1", "role": "master", "masters": [0]}]}, 1, "shard 0: 2 nodes say"),
])
def test_the_one_master_check_passes_only_with_exactly_one_master_per_shard(rendered, tmp_path, status, code, says):
    # A stand-in `delayq status --json` with a fixed answer: the check's verdict is what is tested here;
    # the integration test below runs it against a real node.
    fake = tmp_path / "delayq"
    fake.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(status))})\n")
    fake.chmod(0o755)
    argv = container_argv(the(rendered["default"], "Pod")["spec"]["containers"][0])

    result = subprocess.run([sys.executable, *argv[1:3], "0"], capture_output=True, text=True, timeout=30,
                            env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})

    assert result.returncode == code
    assert says in result.stdout + result.stderr


def test_the_reconcile_cronjob_runs_the_report_and_does_not_retry_a_finding(rendered):
    docs = rendered["production"]
    cron = the(docs, "CronJob")
    job = cron["spec"]["jobTemplate"]["spec"]
    spec = job["template"]["spec"]
    container = spec["containers"][0]

    assert re.fullmatch(r'exec delayq reconcile --out "\$REPORTS/\$\(date [^)]*\)" "\$@"', container["command"][2])
    assert container_env(docs, container, "dq-delayq-reconcile-x")["REPORTS"] == "/reports"
    assert {"mountPath": "/reports", "name": "reports"} in container["volumeMounts"]
    assert {"name": "reports", "persistentVolumeClaim": {"claimName": "delayq-reports"}} in spec["volumes"]
    assert container["image"] == "registry.example.com/platform/delayq:0.1.0-spark"
    rule = job["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [1]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert not of_kind(rendered["default"], "CronJob")


def test_reconcile_extra_args_reach_the_command(rendered):
    container = pod_specs(rendered["everything"])["CronJob/dq-delayq-reconcile"]["containers"][0]

    assert container["command"][-3:] == ["delayq-reconcile", "--days", "7"]


def run_report_command(container: dict, env: dict[str, str], tmp_path: Path) -> list[str]:
    """The arguments the CronJob's shell command gives `delayq` (a stand-in that prints them), run for real by sh."""
    fake = tmp_path / "bin" / "delayq"
    fake.parent.mkdir(parents=True, exist_ok=True)
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    result = subprocess.run(container["command"], capture_output=True, text=True, timeout=30,
                            env={**env, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_each_report_run_writes_a_folder_named_by_its_utc_start_on_the_claim(rendered, tmp_path):
    docs = rendered["everything"]
    container = pod_specs(docs)["CronJob/dq-delayq-reconcile"]["containers"][0]

    argv = run_report_command(container, container_env(docs, container, "dq-delayq-reconcile-x"), tmp_path)

    assert argv[:2] == ["reconcile", "--out"]
    assert re.fullmatch(r"/reports/\d{8}T\d{6}Z", argv[2])
    assert argv[3:] == ["--days", "7"]


@pytest.fixture(scope="module")
def reports_in_a_bucket(helm, value_args, tmp_path_factory) -> list[dict]:
    values = {"reconcile": {"enabled": True, "reports": {
        "url": "s3://delayq-reports/orders/", "credentialsSecret": "reports-s3", "endpoint": "http://minio.storage:9000"}}}
    return template(helm, *value_args["default"], *values_args(values, tmp_path_factory.mktemp("s3"), "s3"))


def test_reports_in_an_object_store_go_to_a_folder_per_run_under_the_url(reports_in_a_bucket, tmp_path):
    docs = reports_in_a_bucket
    spec = pod_specs(docs)["CronJob/dq-delayq-reconcile"]
    container = spec["containers"][0]
    env = container_env(docs, container, "dq-delayq-reconcile-x")

    argv = run_report_command(container, env, tmp_path)

    assert argv[:2] == ["reconcile", "--out"]
    # No doubled '/': the URL's own trailing one is dropped.
    assert re.fullmatch(r"s3://delayq-reports/orders/\d{8}T\d{6}Z", argv[2])
    # Nothing is mounted for reports: the object store is the only place they go.
    assert "reports" not in {volume["name"] for volume in spec["volumes"]}
    assert "/reports" not in {mount["mountPath"] for mount in container["volumeMounts"]}


def test_object_store_credentials_come_from_the_named_secret_and_the_endpoint_from_the_values(reports_in_a_bucket):
    container = pod_specs(reports_in_a_bucket)["CronJob/dq-delayq-reconcile"]["containers"][0]
    env = {var["name"]: var for var in container["env"]}

    # The names pyarrow's S3 client (the AWS SDK) reads.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "reports-s3", "key": name}
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://minio.storage:9000"
    assert not [cm for cm in of_kind(reports_in_a_bucket, "ConfigMap") if "AWS_" in json.dumps(cm)]


def test_reports_on_a_claim_or_in_an_emptydir_get_no_object_store_environment(rendered):
    for values in ("default", "production", "everything"):
        for owner, container, _env in delayq_containers(rendered[values]):
            assert not [var for var in container.get("env", []) if var["name"].startswith("AWS_")], (values, owner)


# --- continuous reconciliation (reconcile.follow) ---------------------------------------------------------------

FOLLOW = "dq-delayq-reconcile-follow"
# What `delayq reconcile --follow` exports (spark/follow.py), by name: the alerts and the dashboard query these.
FOLLOW_METRICS = {
    "delayq_reconcile_findings_total": ("kind", {"duplicated", "early", "cancel_ignored", "missing", "unexpected",
                                                 "reordered", "undeliverable"}),
    "delayq_reconcile_records_total": ("source", {"buffer", "delivered", "dead_letter"}),
    "delayq_reconcile_batches_total": None,
    "delayq_reconcile_lag_seconds": None,
    "delayq_reconcile_last_batch_timestamp_seconds": None,
}
FOLLOW_ALERTS = ("DelayqReconcileFinding", "DelayqReconcileLagging", "DelayqReconcileStalled")


def follow_deployment(docs: list[dict]) -> dict:
    return the(docs, "Deployment", FOLLOW)


def follow_container(docs: list[dict]) -> dict:
    return follow_deployment(docs)["spec"]["template"]["spec"]["containers"][0]


def test_continuous_reconciliation_is_off_by_default_and_renders_nothing(rendered):
    docs = rendered["default"]

    assert not of_kind(docs, "Deployment")
    assert not of_kind(docs, "PersistentVolumeClaim")
    assert [service["metadata"]["name"] for service in of_kind(docs, "Service")] == ["dq-delayq-headless", "dq-delayq"]


def test_continuous_reconciliation_is_one_pod_that_never_overlaps_its_successor(rendered):
    for values in ("production", "everything", "secured"):
        spec = follow_deployment(rendered[values])["spec"]

        # Two followers on one checkpoint must never run at once: one replica, the old pod gone before the new starts.
        assert spec["replicas"] == 1, values
        assert spec["strategy"] == {"type": "Recreate"}, values
        pod_labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= pod_labels.items(), values
        # Neither the nodes' Service, PodDisruptionBudget nor anti-affinity selects it.
        node_selector = the(rendered[values], "StatefulSet")["spec"]["selector"]["matchLabels"]
        assert not node_selector.items() <= pod_labels.items(), values


def test_the_follower_runs_delayq_reconcile_follow_with_the_charts_flags(rendered):
    container = follow_container(rendered["production"])
    argv = dockerfile_instruction("ENTRYPOINT", "reconcile") + container["args"]

    assert "command" not in container
    assert argv == ["delayq", "reconcile", "--follow", "--checkpoint", "/checkpoint",
                    "--findings-topic", "delayq-orders-reconcile-findings", "--metrics-port", "9464",
                    "--trigger", "10", "--grace", "5m"]


def test_the_followers_values_reach_its_flags(rendered):
    args = follow_container(rendered["everything"])["args"]

    assert args == ["reconcile", "--follow", "--checkpoint", "/checkpoint", "--findings-topic", "orders-findings",
                    "--metrics-port", "9500", "--trigger", "2.5", "--grace", "90s", "--retain", "2h"]


def test_an_empty_grace_leaves_the_commands_default(helm, value_args):
    docs = template(helm, *value_args["default"], "--set", "reconcile.follow.enabled=true",
                    "--set", "reconcile.follow.grace=")

    assert "--grace" not in follow_container(docs)["args"]
    assert "--findings-topic" in follow_container(docs)["args"]


def test_the_checkpoint_is_a_claim_the_chart_makes_mounted_where_the_follower_keeps_it(rendered):
    docs = rendered["production"]
    spec = follow_deployment(docs)["spec"]["template"]["spec"]
    container = spec["containers"][0]
    claim = the(docs, "PersistentVolumeClaim", "dq-delayq-reconcile-checkpoint")
    checkpoint = container["args"][container["args"].index("--checkpoint") + 1]

    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert mounts["checkpoint"] == checkpoint == "/checkpoint"
    assert volumes["checkpoint"]["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
    assert claim["metadata"]["name"] == "dq-delayq-reconcile-checkpoint"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    # Written by the image's user: the pod's fsGroup owns the volume.
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]


def test_an_existing_checkpoint_claim_is_mounted_and_none_is_made(rendered):
    docs = rendered["everything"]
    spec = follow_deployment(docs)["spec"]["template"]["spec"]

    assert not of_kind(docs, "PersistentVolumeClaim")
    assert {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "delayq-checkpoint"}} in spec["volumes"]


def test_the_checkpoint_claim_takes_its_storage_class_and_annotations(helm, value_args, tmp_path):
    values = {"reconcile": {"follow": {"enabled": True, "checkpoint": {
        "storageClass": "fast-ssd", "size": "5Gi", "annotations": {"helm.sh/resource-policy": "keep"}}}}}
    claim = the(template(helm, *value_args["default"], *values_args(values, tmp_path, "c")), "PersistentVolumeClaim")

    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


@pytest.mark.parametrize("values", ["production", "everything", "secured"])
def test_the_follower_serves_metrics_on_the_port_its_probes_and_service_use(rendered, values):
    docs = rendered[values]
    container = follow_container(docs)
    port = int(container["args"][container["args"].index("--metrics-port") + 1])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service = the(docs, "Service", FOLLOW)
    pod_labels = follow_deployment(docs)["spec"]["template"]["metadata"]["labels"]

    assert ports == {"metrics": port}
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}, probe
    assert "readinessProbe" not in container  # no traffic is sent to it
    assert service["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # The prometheus_client server listens on DELAYQ_HTTP_HOST: every interface, or the kubelet could not probe it.
    assert container_env(docs, container, "x")["DELAYQ_HTTP_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("values", ["production", "everything", "secured"])
def test_the_follower_runs_the_reconcile_image_with_the_report_jobs_settings_and_credentials(rendered, values):
    docs = rendered[values]
    follower = follow_container(docs)
    report = pod_specs(docs)["CronJob/dq-delayq-reconcile"]["containers"][0]

    for key in ("image", "imagePullPolicy", "workingDir", "envFrom", "securityContext"):
        assert follower[key] == report[key], key
    follower_env = container_env(docs, follower, "x")
    report_env = container_env(docs, report, "x")
    assert {k: v for k, v in follower_env.items() if k != "REPORTS"} == \
        {k: v for k, v in report_env.items() if k != "REPORTS"}
    assert follower_env["HOME"] == "/tmp"
    # The same volumes besides its own: /tmp, the Kafka CA when there is one.
    assert [m for m in follower["volumeMounts"] if m["name"] != "checkpoint"] == \
        [m for m in report["volumeMounts"] if m["name"] != "reports"]
    assert follower["resources"]["requests"]["memory"] == "2Gi"


def test_a_settings_change_restarts_the_follower(helm, value_args):
    def annotations(*sets: str) -> dict:
        args = [a for value in ("reconcile.follow.enabled=true", *sets) for a in ("--set", value)]
        docs = template(helm, *value_args["default"], *args)
        return follow_deployment(docs)["spec"]["template"]["metadata"]["annotations"]

    assert annotations()["checksum/config"] != annotations("config.deliveryBatchSize=10")["checksum/config"]


def test_the_findings_topic_defaults_to_the_clusters(helm, value_args, rendered):
    release = template(helm, *value_args["default"], "--set", "reconcile.follow.enabled=true")
    args = follow_container(release)["args"]

    assert args[args.index("--findings-topic") + 1] == f"delayq-{RELEASE}-reconcile-findings"
    production = follow_container(rendered["production"])["args"]
    assert production[production.index("--findings-topic") + 1] == "delayq-orders-reconcile-findings"


# --- the web console ------------------------------------------------------------------------------------------


def console_deployment(docs: list[dict]) -> dict:
    return the(docs, "Deployment", CONSOLE)


def console_container(docs: list[dict]) -> dict:
    return console_deployment(docs)["spec"]["template"]["spec"]["containers"][0]


def secret_refs(container: dict) -> dict[str, tuple[str, str]]:
    """Variable -> (Secret, key) of each variable ``container`` takes from a Secret."""
    return {var["name"]: (var["valueFrom"]["secretKeyRef"]["name"], var["valueFrom"]["secretKeyRef"]["key"])
            for var in container.get("env", []) if "secretKeyRef" in var.get("valueFrom", {})}


def test_the_console_is_off_by_default_and_renders_nothing(rendered):
    docs = rendered["default"]
    env = container_env(docs, node_container(docs), "dq-delayq-0")

    assert not [doc for doc in docs if doc["metadata"]["name"] == CONSOLE]
    assert not of_kind(docs, "Ingress")
    # No console variable at all: a release without the console sets nothing an older delayq would refuse.
    assert not [name for name in env if name.startswith("DELAYQ_CONSOLE")]


def test_console_enabled_serves_it_under_console_on_every_nodes_port(helm, value_args, monkeypatch):
    docs = template(helm, *value_args["default"], "--set", "console.enabled=true")
    settings = load_settings(container_env(docs, node_container(docs), "dq-delayq-0"), monkeypatch)

    assert settings.console is True and settings.console_actions is False
    # On the node's own HTTP port (its Service's): no pod, Service or Ingress of its own.
    assert not [doc for doc in docs if doc["metadata"]["name"] == CONSOLE]
    assert settings.console_user is None and settings.console_secret_key is None  # no Secret named: no login


@pytest.mark.parametrize("values", ["production", "everything", "secured"])
def test_the_console_deployment_runs_delayq_console_listening_where_its_probes_and_service_look(rendered, values,
                                                                                                 monkeypatch):
    docs = rendered[values]
    container = console_container(docs)
    env = container_env(docs, container, f"{CONSOLE}-x")
    settings = load_settings(env, monkeypatch)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    service = the(docs, "Service", CONSOLE)
    pod_labels = console_deployment(docs)["spec"]["template"]["metadata"]["labels"]

    assert container_argv(container) == ["delayq", "console"]
    # Every interface, or neither the kubelet's probes nor the Service reach it.
    assert settings.console_host == "0.0.0.0"
    assert ports == {"http": settings.console_port}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/console/healthz", "port": "http"}, probe
    assert "startupProbe" not in container  # it serves at once; its index fills behind the pages
    assert [(p["name"], p["targetPort"]) for p in service["spec"]["ports"]] == [("http", "http")]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # Neither the nodes' Service, PodDisruptionBudget nor anti-affinity selects it.
    node_selector = the(docs, "StatefulSet")["spec"]["selector"]["matchLabels"]
    assert not node_selector.items() <= pod_labels.items()
    assert console_deployment(docs)["spec"]["replicas"] == 1


def test_the_console_port_and_service_port_come_from_the_values(rendered):
    container = console_container(rendered["everything"])
    service = the(rendered["everything"], "Service", CONSOLE)

    assert container["ports"] == [{"name": "http", "containerPort": 9090, "protocol": "TCP"}]
    assert service["spec"]["ports"][0]["port"] == 80
    assert the(rendered["production"], "Service", CONSOLE)["spec"]["ports"][0]["port"] == 8090


def test_the_consoles_index_is_a_claim_it_alone_opens_or_an_empty_dir(rendered, monkeypatch):
    for values, volume, strategy in (("production", {"persistentVolumeClaim": {"claimName": CONSOLE}}, "Recreate"),
                                     ("everything", {"emptyDir": {}}, "RollingUpdate")):
        docs = rendered[values]
        spec = console_deployment(docs)["spec"]
        container = console_container(docs)
        settings = load_settings(container_env(docs, container, "x"), monkeypatch)
        mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
        volumes = {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in spec["template"]["spec"]["volumes"]}

        assert mounts["index"] == str(settings.console_data_dir) == "/index", values
        assert volumes["index"] == volume, values
        # A RocksDB on a claim is opened by one process: the old pod stops before the new one starts.
        assert spec["strategy"] == {"type": strategy}, values
    claim = the(rendered["production"], "PersistentVolumeClaim", CONSOLE)
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert not [doc for doc in of_kind(rendered["everything"], "PersistentVolumeClaim")]


def test_an_existing_index_claim_is_mounted_and_none_is_made(helm, value_args):
    docs = template(helm, *value_args["default"], "--set", "console.deployment.enabled=true",
                    "--set", "console.deployment.persistence.existingClaim=console-index")

    assert not of_kind(docs, "PersistentVolumeClaim")
    volumes = console_deployment(docs)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "index", "persistentVolumeClaim": {"claimName": "console-index"}} in volumes


def test_the_console_login_comes_from_its_secret_to_the_console_pod_and_the_nodes(rendered):
    docs = rendered["secured"]

    login = {"DELAYQ_CONSOLE_USER": ("delayq-console", "user"),
             "DELAYQ_CONSOLE_PASSWORD": ("delayq-console", "password"),
             "DELAYQ_CONSOLE_SECRET_KEY": ("delayq-console", "secret-key")}
    for container in (console_container(docs), node_container(docs)):
        refs = secret_refs(container)
        assert {name: ref for name, ref in refs.items() if name.startswith("DELAYQ_CONSOLE")} == login, \
            container["name"]
    config = the(docs, "ConfigMap", "dq-delayq")["data"]
    assert config["DELAYQ_CONSOLE"] == "true" and config["DELAYQ_CONSOLE_ACTIONS"] == "true"
    assert not [name for name in config if name in CONSOLE_LOGIN_VARIABLES]
    # A key set to "" leaves its variable out: a token login only.
    token = secret_refs(console_container(rendered["everything"]))
    assert {name: ref for name, ref in token.items() if name.startswith("DELAYQ_CONSOLE")} == {
        "DELAYQ_CONSOLE_TOKEN": ("console-login", "token"), "DELAYQ_CONSOLE_SECRET_KEY": ("console-login", "secret-key")}
    # Only the pods serving the console get its login.
    for owner, container, _env in delayq_containers(docs):
        if owner not in (f"Deployment/{CONSOLE}", "StatefulSet/dq-delayq"):
            assert not set(secret_refs(container)) & set(CONSOLE_LOGIN_VARIABLES), owner


def test_the_consoles_kafka_user_is_its_own_or_else_the_nodes(helm, value_args, rendered, monkeypatch):
    own = secret_refs(console_container(rendered["production"]))
    assert own["DELAYQ_KAFKA__SASL_PASSWORD"] == ("delayq-credentials", "console-kafka-sasl-password")
    assert container_env(rendered["production"], console_container(rendered["production"]), "x")[
        "DELAYQ_KAFKA__SASL_USERNAME"] == "delayq-console"

    sasl = ["--set", "kafka.securityProtocol=SASL_SSL", "--set", "kafka.sasl.username=delayq-node",
            "--set", "kafka.sasl.password=pw", "--set", "console.deployment.enabled=true"]
    docs = template(helm, *value_args["default"], *sasl)
    settings = load_settings(container_env(docs, console_container(docs), "x"), monkeypatch)
    assert settings.kafka_conf()["sasl.username"] == "delayq-node"
    assert secret_refs(console_container(docs))["DELAYQ_KAFKA__SASL_PASSWORD"] == ("dq-delayq", "kafka-sasl-password")
    assert "console-kafka-sasl-password" not in the(docs, "Secret", "dq-delayq")["stringData"]


def test_the_console_ingress_routes_its_path_to_the_console_service(rendered):
    production = the(rendered["production"], "Ingress", CONSOLE)
    anywhere = the(rendered["everything"], "Ingress", CONSOLE)

    assert production["spec"]["ingressClassName"] == "nginx"
    assert production["spec"]["tls"] == [{"hosts": ["delayq.example.com"], "secretName": "delayq-console-tls"}]
    rule = production["spec"]["rules"][0]
    assert rule["host"] == "delayq.example.com"
    assert rule["http"]["paths"] == [{"path": "/console", "pathType": "Prefix", "backend": {
        "service": {"name": CONSOLE, "port": {"name": "http"}}}}]
    assert [port["name"] for port in the(rendered["production"], "Service", CONSOLE)["spec"]["ports"]] == ["http"]
    # No host: any; no tlsSecret: no TLS section.
    assert "host" not in anywhere["spec"]["rules"][0] and "tls" not in anywhere["spec"]
    assert anywhere["spec"]["rules"][0]["http"]["paths"][0]["path"] == "/"
    assert not of_kind(rendered["secured"], "Ingress")


def test_a_settings_change_restarts_the_console(helm, value_args):
    def annotations(*sets: str) -> dict:
        args = [a for value in ("console.deployment.enabled=true", *sets) for a in ("--set", value)]
        return console_deployment(template(helm, *value_args["default"], *args))["spec"]["template"]["metadata"][
            "annotations"]

    assert annotations()["checksum/config"] != annotations("console.actions.enabled=true",
                                                           "console.auth.existingSecret=login")["checksum/config"]


def test_notes_tell_where_the_console_is_and_which_acls_its_kafka_user_needs(helm, value_args, tmp_path):
    production = render_notes(helm, tmp_path / "production", *value_args["production"])
    nodes = render_notes(helm, tmp_path / "nodes", *value_args["default"], "--set", "console.enabled=true")
    off = render_notes(helm, tmp_path / "off", *value_args["default"])

    assert "7. The web console: shards, upcoming messages" in production
    assert "cancel, reschedule\n   and replay after a login (Secret delayq-console)" in production
    assert f"kubectl -n {NAMESPACE} port-forward svc/{CONSOLE} 8090:8090" in production
    assert "https://delayq.example.com/console/" in production
    assert "delayq acls --console User:delayq-console --apply" in production
    assert "delayq acls --console User:delayq --apply" not in production  # the nodes do not serve it there
    assert "5. The web console" in nodes and "(read-only)" in nodes
    assert "port-forward svc/dq-delayq 8080:8080\n     open http://localhost:8080/console/" in nodes
    assert "delayq acls --console" not in nodes  # PLAINTEXT: no ACLs
    assert "web console" not in off


# --- Prometheus Operator objects (no bundled schema: structure asserted here) -----------------------------------


def test_service_monitor_scrapes_every_node_through_the_http_service(rendered):
    docs = rendered["production"]
    monitor = the(docs, "ServiceMonitor", "dq-delayq")
    http = the(docs, "Service", "dq-delayq")
    headless = the(docs, "Service", "dq-delayq-headless")
    selector = monitor["spec"]["selector"]["matchLabels"].items()

    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert selector <= http["metadata"]["labels"].items()
    assert not selector <= headless["metadata"]["labels"].items()  # each node scraped once, not twice
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_followers_service_monitor_scrapes_it_alone_under_the_nodes_job(rendered):
    docs = rendered["production"]
    monitor = the(docs, "ServiceMonitor", FOLLOW)
    selector = monitor["spec"]["selector"]["matchLabels"].items()
    follower = the(docs, "Service", FOLLOW)

    assert selector <= follower["metadata"]["labels"].items()
    for name in ("dq-delayq", "dq-delayq-headless"):
        assert not selector <= the(docs, "Service", name)["metadata"]["labels"].items(), name
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}]
    # The Prometheus Operator names the job after the Service's jobLabel label: the nodes' job (their Service's
    # name), so the dashboard's job variable selects the follower's series too.
    assert follower["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "dq-delayq"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert not [m for m in of_kind(rendered["default"], "ServiceMonitor")]


def test_prometheus_rule_alerts_on_no_master_ingest_lag_and_dead_letters(rendered):
    rule = the(rendered["production"], "PrometheusRule")
    groups = rule["spec"]["groups"]
    alerts = {r["alert"]: r for group in groups for r in group["rules"]}

    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert {"DelayqNoMaster", "DelayqIngestLag", "DelayqDeadLetters"} <= alerts.keys()
    assert "delayq_is_master" in alerts["DelayqNoMaster"]["expr"]
    assert "delayq_buffer_lag" in alerts["DelayqIngestLag"]["expr"] and "> 50000" in alerts["DelayqIngestLag"]["expr"]
    assert "delayq_dead_lettered_total" in alerts["DelayqDeadLetters"]["expr"]
    assert "delayq_held_partitions" in alerts["DelayqBufferPartitionHeld"]["expr"]
    assert alerts["DelayqBufferPartitionHeld"]["for"] == "2m"
    selector = f'namespace="{NAMESPACE}", service="dq-delayq"'
    follower = f'namespace="{NAMESPACE}", service="{FOLLOW}"'
    for name, alert in alerts.items():
        assert set(alert) <= {"alert", "expr", "for", "labels", "annotations"}, name
        assert alert["labels"]["severity"] in {"critical", "warning"}, name
        assert {"summary", "description"} <= alert["annotations"].keys(), name
        assert re.fullmatch(r"(\d+[smh])+", alert.get("for", "0s")), name
        if name in FOLLOW_ALERTS:
            assert follower in alert["expr"], name
        elif name != "DelayqReconcileFailed":
            assert selector in alert["expr"], name
        assert alert["expr"].count("(") == alert["expr"].count(")"), name


def test_master_and_lag_alerts_are_per_shard(helm, value_args, rendered):
    selector = f'namespace="{NAMESPACE}", service="dq-delayq"'
    production = {r["alert"]: r["expr"] for group in the(rendered["production"], "PrometheusRule")["spec"]["groups"]
                  for r in group["rules"]}
    default = {r["alert"]: r["expr"] for group in the(template(
        helm, *value_args["default"], "--set", "metrics.prometheusRule.enabled=true"), "PrometheusRule")["spec"]["groups"]
        for r in group["rules"]}

    # Fewer shards with a master than config.shards (6 in production) is a shard nothing delivers.
    assert production["DelayqNoMaster"] == \
        f"(count(max by (shard) (delayq_is_master{{{selector}}}) == 1) or vector(0)) < 6"
    assert default["DelayqNoMaster"] == \
        f"(count(max by (shard) (delayq_is_master{{{selector}}}) == 1) or vector(0)) < 1"
    for alerts in (production, default):
        assert alerts["DelayqSeveralMasters"] == f"max(sum by (shard) (delayq_is_master{{{selector}}})) > 1"
        assert alerts["DelayqBufferPartitionHeld"] == f"max by (shard) (delayq_held_partitions{{{selector}}}) > 0"
    assert production["DelayqIngestLag"] == f"sum by (pod) (delayq_buffer_lag{{{selector}}}) > 50000"
    assert default["DelayqIngestLag"] == f"sum by (pod) (delayq_buffer_lag{{{selector}}}) > 10000"


def rule_exprs(docs: list[dict]) -> dict[str, str]:
    return {r["alert"]: r["expr"] for group in the(docs, "PrometheusRule")["spec"]["groups"] for r in group["rules"]}


def test_the_continuous_reconciliations_alerts_render_only_with_it(helm, value_args, rendered):
    without = rule_exprs(template(helm, *value_args["default"], "--set", "metrics.prometheusRule.enabled=true",
                                  "--set", "reconcile.enabled=true"))

    assert set(FOLLOW_ALERTS) <= rule_exprs(rendered["production"]).keys()
    assert not set(FOLLOW_ALERTS) & without.keys()
    assert "DelayqReconcileFailed" in without


def test_a_finding_that_breaks_the_promise_is_critical_and_says_where_to_read_it(rendered):
    rules = {r["alert"]: r for group in the(rendered["production"], "PrometheusRule")["spec"]["groups"]
             for r in group["rules"]}
    finding = rules["DelayqReconcileFinding"]
    selector = f'namespace="{NAMESPACE}", service="{FOLLOW}"'

    assert finding["expr"] == (
        f'sum by (kind) (increase(delayq_reconcile_findings_total{{{selector}, '
        f'kind=~"duplicated|early|cancel_ignored|missing|unexpected"}}[10m])) > 0')
    assert finding["labels"]["severity"] == "critical"
    assert "{{ $labels.kind }}" in finding["annotations"]["description"]
    assert "topic delayq-orders-reconcile-findings" in finding["annotations"]["description"]
    assert f"kubectl -n {NAMESPACE} logs deploy/{FOLLOW}" in finding["annotations"]["description"]
    # The kinds it alerts on are kinds the follower counts.
    alerting = re.search(r'kind=~"([^"]+)"', finding["expr"]).group(1).split("|")
    assert set(alerting) < FOLLOW_METRICS["delayq_reconcile_findings_total"][1]


def test_lag_and_stall_alerts_take_their_thresholds_from_the_values(helm, value_args, rendered):
    selector = f'namespace="{NAMESPACE}", service="{FOLLOW}"'
    default = rule_exprs(rendered["production"])
    changed = rule_exprs(template(
        helm, *value_args["production"], "--set", "metrics.prometheusRule.reconcileLagSeconds=120",
        "--set", "metrics.prometheusRule.reconcileStalledMinutes=3",
        "--set", "metrics.prometheusRule.reconcileFindingWindow=30m"))

    assert default["DelayqReconcileLagging"] == f"max(delayq_reconcile_lag_seconds{{{selector}}}) > 300"
    assert changed["DelayqReconcileLagging"] == f"max(delayq_reconcile_lag_seconds{{{selector}}}) > 120"
    # A follower that finished no batch yet reports 0: it is starting, not stalled.
    assert default["DelayqReconcileStalled"] == \
        f"time() - max(delayq_reconcile_last_batch_timestamp_seconds{{{selector}}} > 0) > 600"
    assert changed["DelayqReconcileStalled"].endswith(" > 180")
    assert "[30m]" in changed["DelayqReconcileFinding"]


def node_series() -> set[str]:
    """Every series name a node's registry exposes once each labelled family has a child."""
    from prometheus_client import generate_latest

    from delayq.delay_service.metrics import NodeMetrics

    metrics = NodeMetrics()
    shard = metrics.shard(0)  # what a node's feed and master create: every per-shard series
    shard.dead_lettered.labels("missing-topic").inc()
    shard.rebuilds.labels("stale").inc()
    metrics.ingested.labels("put").inc()
    shard.lateness.observe_many([0.01])
    return {line.split("{")[0].split(" ")[0] for line in generate_latest(metrics.registry).decode().splitlines()
            if line and not line.startswith("#")}


def test_every_metric_an_alert_names_is_one_the_nodes_or_the_follower_export(rendered):
    nodes = node_series()

    for name, expr in rule_exprs(rendered["production"]).items():
        for metric in re.findall(r"\bdelayq_\w+", expr):
            assert metric in (FOLLOW_METRICS if name in FOLLOW_ALERTS else nodes), (name, metric)


# --- Grafana dashboard (files/grafana-dashboard.json in a ConfigMap for the Grafana sidecar) ---------------------

DASHBOARD_FILE = CHART / "files" / "grafana-dashboard.json"
DASHBOARD_CONFIG_MAP = "dq-delayq-grafana-dashboard"
# What every delayq series in a panel is narrowed to: the dashboard's namespace, job and node variables.
DASHBOARD_SELECTOR = 'namespace="$namespace", job="$job", pod=~"$pod"'
# The follower's series carry the nodes' job (its ServiceMonitor's jobLabel) but no node's pod.
FOLLOW_DASHBOARD_SELECTOR = 'namespace="$namespace", job="$job"'


def dashboard_config_maps(docs: list[dict]) -> list[dict]:
    return [cm for cm in of_kind(docs, "ConfigMap") if cm["metadata"]["name"] == DASHBOARD_CONFIG_MAP]


def dashboard_targets(dashboard: dict) -> list[tuple[str, dict]]:
    """(panel title, target) of every query of every panel."""
    return [(panel["title"], target) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def datasource_refs(node: object, path: str = "") -> list[tuple[str, object]]:
    """Every "datasource" value anywhere in the dashboard, with where it is."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                found.append((f"{path}.{key}", value))
            found += datasource_refs(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += datasource_refs(value, f"{path}[{i}]")
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD_FILE.read_text())


def test_the_grafana_dashboard_config_map_renders_only_when_enabled(helm, value_args, rendered):
    enabled = template(helm, *value_args["default"], "--set", "metrics.grafanaDashboard.enabled=true")

    assert not dashboard_config_maps(rendered["default"])  # off by default
    assert not dashboard_config_maps(rendered["secured"])
    assert len(dashboard_config_maps(enabled)) == 1
    assert len(dashboard_config_maps(rendered["production"])) == 1
    # Nothing else changes: the dashboard is one more ConfigMap.
    assert len(enabled) == len(rendered["default"]) + 1


def test_the_grafana_dashboard_config_map_carries_the_sidecar_label_in_the_release_namespace(helm, value_args):
    config_map, = dashboard_config_maps(
        template(helm, *value_args["default"], "--set", "metrics.grafanaDashboard.enabled=true"))
    labels = config_map["metadata"]["labels"]

    assert labels["grafana_dashboard"] == "1"  # kube-prometheus-stack's and bitnami/grafana's sidecar label
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert config_map["metadata"]["namespace"] == NAMESPACE
    assert "annotations" not in config_map["metadata"]


def test_the_grafana_dashboard_goes_to_the_namespace_labels_and_annotations_given(helm, value_args, rendered,
                                                                                 tmp_path):
    values = {"metrics": {"grafanaDashboard": {
        "enabled": True, "namespace": "monitoring", "labels": {"dashboards": "kafka", "grafana_dashboard": None},
        "annotations": {"grafana_folder": "Kafka"}}}}
    config_map, = dashboard_config_maps(template(helm, *value_args["default"], *values_args(values, tmp_path, "g")))
    numeric, = dashboard_config_maps(template(helm, *value_args["default"], "--set",
                                              "metrics.grafanaDashboard.enabled=true", "--set",
                                              "metrics.grafanaDashboard.labels.grafana_dashboard=1"))
    everything, = dashboard_config_maps(rendered["everything"])

    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["dashboards"] == "kafka"
    assert "grafana_dashboard" not in config_map["metadata"]["labels"]  # null removes the default label
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Kafka"}
    # --set makes 1 a number; a label value must be a string, or the API server refuses the ConfigMap.
    assert numeric["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert everything["metadata"]["annotations"] == {"grafana_folder": "Kafka", "team": "platform"}


@pytest.mark.parametrize("values", ["production", "everything"])
def test_the_grafana_dashboard_config_map_holds_the_charts_dashboard_json(rendered, values, dashboard):
    config_map, = dashboard_config_maps(rendered[values])

    assert list(config_map["data"]) == ["delayq.json"]
    assert json.loads(config_map["data"]["delayq.json"]) == dashboard


def test_the_dashboard_is_a_recent_grafana_dashboard_with_a_uid_and_unique_panel_ids(dashboard):
    ids = [panel["id"] for panel in dashboard["panels"]]

    assert dashboard["schemaVersion"] >= 36  # datasources referenced as {type, uid} objects (Grafana 8.3+)
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dashboard["uid"])
    assert dashboard["title"]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_dashboard_panel_has_a_title_and_a_query(dashboard):
    assert len(dashboard["panels"]) >= 10
    for panel in dashboard["panels"]:
        assert isinstance(panel.get("title"), str) and panel["title"].strip(), panel
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert isinstance(target.get("expr"), str) and target["expr"].strip(), panel["title"]
            assert target["expr"].count("(") == target["expr"].count(")"), panel["title"]
            assert target["expr"].count("{") == target["expr"].count("}"), panel["title"]


def test_the_dashboard_shows_masters_elections_pending_lag_deliveries_dead_letters_lateness_and_rebuilds(dashboard):
    exprs = " ".join(target["expr"] for _, target in dashboard_targets(dashboard))
    lateness = [target["expr"] for _, target in dashboard_targets(dashboard)
                if "delayq_delivery_lateness_seconds_bucket" in target["expr"]]

    for series in ("delayq_is_master", "delayq_elections_total", "delayq_pending", "delayq_buffer_lag",
                   "delayq_delivered_total", "delayq_dead_lettered_total", "delayq_store_rebuilds_total"):
        assert series + "{" in exprs, series
    assert "sum by (reason) (rate(delayq_dead_lettered_total{" in exprs
    assert any(e.startswith("histogram_quantile(0.5, sum by (le) (rate(") for e in lateness)
    assert any(e.startswith("histogram_quantile(0.99, sum by (le) (rate(") for e in lateness)


def test_the_dashboard_queries_prometheus_through_its_datasource_variable(dashboard):
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    refs = datasource_refs(dashboard)

    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job", "pod"):
        assert variables[name]["type"] == "query", name
    # Every panel, query and variable reads ${datasource}; Grafana's own annotation source is the only other.
    for where, ref in refs:
        if where.startswith(".annotations."):
            assert ref == {"type": "grafana", "uid": "-- Grafana --"}, where
        else:
            assert ref == {"type": "prometheus", "uid": "${datasource}"}, where
    assert len(refs) > len(dashboard["panels"]) + len(dashboard_targets(dashboard))


def test_every_dashboard_query_is_narrowed_to_the_chosen_namespace_job_and_nodes(dashboard):
    for title, target in dashboard_targets(dashboard):
        selectors = re.findall(r"\b(delayq_\w+)(\{[^}]*\})?", target["expr"])
        assert selectors, title
        for metric, selector in selectors:
            if metric in FOLLOW_METRICS:
                assert selector.startswith("{" + FOLLOW_DASHBOARD_SELECTOR), f"{title}: {metric}{selector}"
                assert "pod" not in selector, f"{title}: {metric}{selector}"
            else:
                assert selector == "{" + DASHBOARD_SELECTOR + "}", f"{title}: {metric}{selector}"


def test_the_dashboard_shows_the_continuous_reconciliations_findings_lag_batches_and_records(dashboard):
    queried = {name for _, target in dashboard_targets(dashboard) for name in re.findall(r"\bdelayq_\w+",
                                                                                       target["expr"])}
    by_title = {title: target["expr"] for title, target in dashboard_targets(dashboard)}

    assert set(FOLLOW_METRICS) <= queried
    assert by_title["Reconciliation findings by kind (5 min)"].startswith(
        "sum by (kind) (increase(delayq_reconcile_findings_total{")
    assert by_title["Reconciled records by source"].startswith("sum by (source) (rate(delayq_reconcile_records_total{")
    # The headline count is what the DelayqReconcileFinding alert counts.
    assert 'kind=~"duplicated|early|cancel_ignored|missing|unexpected"' in by_title["Reconciliation findings"]


def test_every_metric_the_dashboard_queries_is_one_the_node_registry_exposes(dashboard):
    exposed = node_series()
    queried = {name for _, target in dashboard_targets(dashboard) for name in re.findall(r"\bdelayq_\w+",
                                                                                       target["expr"])}

    assert queried
    unknown = queried - exposed - set(FOLLOW_METRICS)
    assert not unknown, f"the dashboard queries series neither a node nor the follower exposes: {sorted(unknown)}"


def render_notes(helm: Path, tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it: helm template skips it, so a copy of the chart wraps it in a manifest."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = chart / "templates" / "NOTES.txt"
    (chart / "templates" / "_notes_preview.tpl").write_text(
        '{{- define "notes-preview" }}' + notes.read_text() + "{{- end }}")
    (chart / "templates" / "notes-preview.yaml").write_text('notes: {{ include "notes-preview" . | toJson }}')
    notes.unlink()
    result = run_helm(helm, "template", RELEASE, str(chart), "--namespace", NAMESPACE, "--kube-version",
                      KUBE_VERSIONS[0], "--show-only", "templates/notes-preview.yaml", *args)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["notes"]


def test_notes_tell_how_to_check_the_cluster(helm, value_args, tmp_path):
    notes = render_notes(helm, tmp_path, *value_args["default"])

    assert f"kubectl -n {NAMESPACE} rollout status statefulset/dq-delayq" in notes
    assert f"helm test {RELEASE} -n {NAMESPACE}" in notes
    assert f"kubectl -n {NAMESPACE} exec dq-delayq-0 -- delayq status" in notes
    assert "curl localhost:8080/readyz" in notes
    assert "delayq_is_master" in notes


def test_notes_give_the_shard_count_and_the_one_master_per_shard_check(helm, value_args, tmp_path):
    notes = render_notes(helm, tmp_path, *value_args["default"], "--set", "config.shards=4",
                         "--set", "config.bufferPartitions=8", "--set", "config.replicas=2")

    assert "Shards: 4 (of 8 buffer partitions; fixed by the first `delayq init`)" in notes
    assert "held by 2 of the nodes" in notes
    assert "must be 1 for each of the 4 shard(s)" in notes and "sum by (shard) (delayq_is_master)" in notes
    assert "`delayq status` shows each shard's master" in notes
    assert f"kubectl -n {NAMESPACE} exec dq-delayq-0 -- delayq status" in notes
    assert "WARNING: config.replicas=1" not in notes
    assert "held by every node" in render_notes(helm, tmp_path / "all", *value_args["default"])


def test_notes_tell_where_the_continuous_reconciliation_reports_its_findings(helm, value_args, tmp_path):
    notes = render_notes(helm, tmp_path / "on", *value_args["production"])
    off = render_notes(helm, tmp_path / "off", *value_args["default"])

    assert "6. The continuous reconciliation judges every message as it falls due" in notes
    assert f"kubectl -n {NAMESPACE} logs -f deploy/{FOLLOW}" in notes
    assert "-C -t delayq-orders-reconcile-findings -o beginning -e" in notes
    assert "kcat needs your -X security.protocol=... settings" in notes  # production's Kafka is SASL_SSL
    assert f"port-forward svc/{FOLLOW} 9464:9464" in notes and "grep ^delayq_reconcile_" in notes
    assert "continuous reconciliation" not in off


def test_notes_warn_that_replicas_1_leaves_shards_without_a_standby(helm, value_args, tmp_path):
    single = render_notes(helm, tmp_path / "one", *value_args["default"], "--set", "config.replicas=1")
    alone = render_notes(helm, tmp_path / "alone", *value_args["default"], "--set", "config.replicas=1",
                         "--set", "replicaCount=1")

    assert "WARNING: config.replicas=1: each shard lives on one node only" in single
    # With one node there is no standby to lose: replicas 0 and 1 are the same cluster.
    assert "WARNING: config.replicas=1" not in alone


# --- documentation of the chart -------------------------------------------------------------------------------


def leaf_paths(values: dict, prefix: str = "") -> dict[str, object]:
    paths = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths.update(leaf_paths(value, f"{path}."))
        else:
            paths[path] = value
    return paths


def test_values_yaml_documents_every_key_with_a_param_line():
    text = (CHART / "values.yaml").read_text()
    params = re.findall(r"^\s*## @param (\S+) \S", text, re.MULTILINE)
    leaves = leaf_paths(yaml.safe_load(text))

    assert len(params) == len(set(params)), "a key is documented twice"
    # A leaf is documented by its own line, or it sits inside a map documented as a whole (resources, ...).
    undocumented = [leaf for leaf in leaves if not any(leaf == p or leaf.startswith(p + ".") for p in params)]
    assert not undocumented
    unknown = [p for p in params if not any(leaf == p or leaf.startswith(p + ".") for leaf in leaves)]
    assert not unknown, f"@param lines for keys values.yaml does not have: {unknown}"


def test_every_helper_define_has_a_one_line_comment():
    lines = (CHART / "templates" / "_helpers.tpl").read_text().splitlines()

    defines = [i for i, line in enumerate(lines) if line.startswith("{{- define ")]
    assert defines
    for i in defines:
        assert re.fullmatch(r"\{\{/\* .+ \*/\}\}", lines[i - 1]), lines[i]


# --- the image ----------------------------------------------------------------------------------------------------


def docker_context() -> list[Path]:
    """Files a `docker build .` sends, after .dockerignore (its patterns here are names and globs, no '!')."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "docker_context() does not handle exceptions"

    def ignored(relative: Path) -> bool:
        for pattern in patterns:
            if pattern.startswith("**/"):
                if any(part.match(pattern[3:]) for part in map(Path, relative.parts)):
                    return True
            elif any(Path(*relative.parts[:n]).match(pattern) and len(Path(pattern).parts) == n
                     for n in range(1, len(relative.parts) + 1)):
                return True
        return False

    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    return [Path(name) for name in tracked if not ignored(Path(name))]


def test_docker_context_holds_the_package_and_nothing_else():
    context = docker_context()
    tops = {path.parts[0] for path in context}
    package_dirs = set(re.findall(r'^"delayq[.\w]*" = "(\w+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE))

    assert package_dirs and package_dirs <= tops
    assert {"pyproject.toml", "README.md"} <= tops
    assert not tops & {".venv", "tests", "helm", ".git", "docs"}


def test_the_docker_context_builds_the_package(tmp_path):
    source = tmp_path / "context"
    for relative in docker_context():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, source / relative)

    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(tmp_path / "wheels"), str(source)], capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "wheels").glob("delayq-*.whl"))


def test_the_image_runs_a_node_as_the_chart_expects():
    text = (ROOT / "Dockerfile").read_text()

    assert dockerfile_instruction("ENTRYPOINT") == ["delayq"]
    assert dockerfile_instruction("CMD") == ["node"]
    assert re.search(r"^USER 10001:10001$", text.split("AS node")[1], re.MULTILINE)
    assert "openjdk-17-jre-headless" in text.split("AS reconcile")[1].split("FROM")[0]
    assert re.search(r"^FROM \$\{PYTHON_IMAGE\} AS base$", text, re.MULTILINE)
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in text
    # The image installs the wheel built from the tree (tests/integration/test_wheel.py runs that wheel), not the tree.
    assert re.search(r"^RUN pip wheel --no-deps --wheel-dir /tmp/dist /tmp/src$", text.split("AS wheel")[1], re.M)
    base = text.split("AS base")[1].split("FROM")[0]
    assert "COPY --from=wheel /tmp/dist/ /tmp/dist/" in base
    # With what a node and the reconciliation need (extras), at the locked versions make install uses.
    assert 'pip install -c /tmp/constraints.txt "$(ls /tmp/dist/delayq-*.whl)[node,console,reconcile]"' in base
    assert "COPY constraints.txt /tmp/constraints.txt" in base and (ROOT / "constraints.txt").is_file()
    assert "/tmp/src" not in base


# --- the chart's containers against a real node ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def local_argv(argv: list[str]) -> list[str]:
    """The container's argv on this machine: the image's `delayq` and `python` are the venv's."""
    programs = {"delayq": str(Path(sys.executable).with_name("delayq")), "python": sys.executable}
    return [programs.get(argv[0], argv[0]), *argv[1:]]


def local_env(env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base['PATH']}"
    return {**base, **env}


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except (urllib.error.URLError, ConnectionError) as err:
        # What the kubelet sees before the server listens: a failed probe.
        return 0, str(err)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_charts_init_node_probes_and_helm_test_work_on_the_real_stack(helm, dev_stack, names, tmp_path):
    port = free_port()
    values = {
        "kafka": {"bootstrapServers": dev_stack.bootstrap_servers},
        "zookeeper": {"connect": dev_stack.zk_connect, "sessionTimeoutMs": 3000},
        "config": {"cluster": names.cluster, "bufferPartitions": 3, "bufferReplicationFactor": 1},
        "containerPorts": {"http": port},
        "persistence": {"mountPath": str(tmp_path / "data")},
        "tests": {"timeoutSeconds": 60},
    }
    docs = template(helm, *values_args(values, tmp_path, "stack"))
    sts = the(docs, "StatefulSet")
    runs_node = node_container(docs)
    init_container = the(docs, "Job")["spec"]["template"]["spec"]["containers"][0]
    test_container = the(docs, "Pod")["spec"]["containers"][0]

    init = subprocess.run(local_argv(container_argv(init_container)), capture_output=True, text=True, timeout=120,
                          env=local_env(container_env(docs, init_container, "dq-delayq-init-x")))
    assert init.returncode == 0, init.stdout + init.stderr
    topics = AdminClient({"bootstrap.servers": dev_stack.bootstrap_servers}).list_topics(timeout=10)
    assert f"delayq-{names.cluster}-buffer" in topics.topics

    log = (tmp_path / "node.log").open("w")
    node = subprocess.Popen(local_argv(container_argv(runs_node)), stdout=log, stderr=subprocess.STDOUT,
                            env=local_env(container_env(docs, runs_node, f"{sts['metadata']['name']}-0")))
    try:
        probes = {name: runs_node[name]["httpGet"] for name in ("startupProbe", "readinessProbe", "livenessProbe")}
        ports = {p["name"]: p["containerPort"] for p in runs_node["ports"]}

        def probe(name: str) -> int:
            get = probes[name]
            return http_get(f"http://127.0.0.1:{ports[get['port']]}{get['path']}")[0]

        deadline = time.monotonic() + 90
        while probe("startupProbe") != 200:
            assert node.poll() is None, (tmp_path / "node.log").read_text()
            assert time.monotonic() < deadline, "the startup probe never passed: " + (tmp_path / "node.log").read_text()
            time.sleep(0.5)
        assert probe("readinessProbe") == 200
        assert probe("livenessProbe") == 200
        # Ready (caught up) first; mastership follows within the next placement round (half a second).
        deadline = time.monotonic() + 10
        while not re.search(r'^delayq_is_master\{shard="0"\} 1\.0$', http_get(f"http://127.0.0.1:{port}/metrics")[1],
                            re.MULTILINE):
            assert time.monotonic() < deadline, "a lone ready node did not become master of its one shard"
            time.sleep(0.2)

        check = subprocess.run(local_argv(container_argv(test_container)), capture_output=True, text=True, timeout=90,
                               env=local_env(container_env(docs, test_container, "dq-delayq-test-one-master")))
        assert check.returncode == 0, check.stdout + check.stderr
        assert f"one master per shard: 0 {sts['metadata']['name']}-0" in check.stdout
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            code = node.wait(timeout=sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
        except subprocess.TimeoutExpired:
            node.kill()
            raise
        log.close()
    assert code == 0, (tmp_path / "node.log").read_text()

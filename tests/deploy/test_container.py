"""deploy/Dockerfile, docker-compose.yml and k8s/, checked without a container runtime.

No image is built here (there is no registry for base images). What can be checked offline is:
the Dockerfile's stages, user, health check and the files it copies; the image's command line and
health check, run for real against a publisher on the image's config.js; and that the compose
file and the Kubernetes manifests parse and fit together (names, ports, probes, selectors).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from publisher.config.settings import load_config, parse_config
from tests.deploy.balancers import DEPLOY
from tests.servers import PublisherProcess, RedisServer, scaled

ROOT = DEPLOY.parent
PORT = 8080  # the image's port: EXPOSE, CMD, compose, the k8s Service and the balancers


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        logical.append(pending)
        pending = ""
    assert not pending, "a continuation line ends the Dockerfile"
    return [(word.upper(), rest.strip()) for word, _, rest in (s.partition(" ") for s in logical)]


def stages(steps: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for step in steps:
        if step[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(step)
    return found


def exec_form(arguments: str) -> list[str]:
    value = json.loads(arguments)
    assert isinstance(value, list) and all(isinstance(a, str) for a in value), arguments
    return value


DOCKERFILE = instructions(DEPLOY / "Dockerfile")


def only(steps: list[tuple[str, str]], instruction: str) -> str:
    (found,) = [args for name, args in steps if name == instruction]
    return found


def healthcheck_command() -> list[str]:
    arguments = only(stages(DOCKERFILE)[-1], "HEALTHCHECK")
    options, _, command = arguments.partition("CMD ")
    assert re.search(r"--interval=\d+s", options) and re.search(r"--timeout=\d+s", options)
    return exec_form(command)


def test_the_dockerfile_builds_in_two_stages_and_runs_unprivileged() -> None:
    build, runtime = stages(DOCKERFILE)
    assert re.fullmatch(r"\S+ AS build", build[0][1])
    assert re.fullmatch(r"\S+ AS runtime", runtime[0][1])
    # The runtime stage takes the wheels from the build stage and no sources.
    assert any(name == "RUN" and "from=build" in args for name, args in runtime)
    assert not any(name == "COPY" and re.search(r"(^|\s)(publisher|listener|changefeed)/", args)
                   for name, args in runtime)
    user = only(runtime, "USER")
    assert user not in ("root", "0") and not user.startswith("0:")
    names = [name for name, _ in runtime]
    assert names.index("USER") < names.index("ENTRYPOINT") and names[-1] == "CMD"
    assert only(runtime, "EXPOSE") == str(PORT)
    assert only(runtime, "STOPSIGNAL") == "SIGTERM"
    assert "/readyz" in " ".join(healthcheck_command())


def test_every_file_the_dockerfile_copies_exists_and_passes_the_dockerignore() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore
    for name, arguments in DOCKERFILE:
        if name != "COPY" or "--from" in arguments:
            continue
        *sources, _destination = shlex.split(arguments)
        for source in sources:
            assert (ROOT / source).exists(), source
            assert source.rstrip("/") in allowed, f"{source} is excluded by the .dockerignore"


def test_the_image_command_line_and_health_check_against_a_real_publisher(
    redis_server: RedisServer,
) -> None:
    """ENTRYPOINT + CMD with deploy/config.js (its Redis replaced by the test's, a free port
    instead of 8080), and the HEALTHCHECK command: healthy while it serves with its Redis, not
    without Redis, nor after."""
    runtime = stages(DOCKERFILE)[-1]
    assert exec_form(only(runtime, "ENTRYPOINT")) == ["changefeed"]
    command = exec_form(only(runtime, "CMD"))
    assert command[:3] == ["serve", "--config", "/etc/changefeed/config.js"]
    assert command[3:] == ["--host", "0.0.0.0", "--port", str(PORT)]
    # Later options win: the test's port and Redis.
    publisher = PublisherProcess(DEPLOY / "config.js", *command[3:], "--port", "0",
                                 "--redis-url", redis_server.url).start()
    health = healthcheck_command()
    assert health[0] == "python"
    try:
        port = publisher.url.rsplit(":", 1)[1]
        probe = [sys.executable, *[a.replace(f":{PORT}/", f":{port}/") for a in health[1:]]]
        assert subprocess.run(probe, capture_output=True, timeout=scaled(10)).returncode == 0
        # Readiness, not only liveness: a publisher whose Redis is gone is unhealthy.
        redis_server.stop()
        assert subprocess.run(probe, capture_output=True, timeout=scaled(10)).returncode != 0
    finally:
        publisher.stop()
    assert subprocess.run(probe, capture_output=True, timeout=scaled(10)).returncode != 0


def load_yaml(path: Path) -> list[dict[str, Any]]:
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert documents and all(isinstance(doc, dict) for doc in documents), path
    return documents


def test_docker_compose_runs_redis_with_aof_two_publishers_and_a_balancer() -> None:
    (compose,) = load_yaml(DEPLOY / "docker-compose.yml")
    services = compose["services"]
    assert set(services) == {"redis", "publisher-1", "publisher-2", "lb"}
    redis = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis and "--maxmemory-policy noeviction" in redis
    assert "healthcheck" in services["redis"]
    for name in ("publisher-1", "publisher-2"):
        publisher = services[name]
        context = (DEPLOY / publisher["build"]["context"]).resolve()
        assert context == ROOT and (context / publisher["build"]["dockerfile"]).is_file()
        assert publisher["depends_on"]["redis"]["condition"] == "service_healthy"
    # The balancer's configuration names exactly the compose services, on the image's port.
    (volume,) = services["lb"]["volumes"]
    mounted = DEPLOY / volume.split(":")[0]
    servers = re.findall(r"^\s*server \S+ (\S+:\d+)", mounted.read_text(), re.M)
    assert servers == [f"publisher-1:{PORT}", f"publisher-2:{PORT}"]
    upstream = re.findall(r"^\s*server (\S+:\d+) ", (DEPLOY / "nginx.conf").read_text(), re.M)
    assert upstream == servers
    assert services["lb"]["ports"] == [f"127.0.0.1:{PORT}:{PORT}"]
    # The image's config.js reaches the compose Redis.
    config = load_config(DEPLOY / "config.js")
    assert config.bucket.redis_url == "redis://redis:6379/0"


def k8s() -> dict[str, dict[str, Any]]:
    (kustomization,) = load_yaml(DEPLOY / "k8s" / "kustomization.yaml")
    objects: dict[str, dict[str, Any]] = {}
    for resource in kustomization["resources"]:
        for document in load_yaml(DEPLOY / "k8s" / resource):
            assert document["kind"] not in objects, document["kind"]
            objects[document["kind"]] = document
    files = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert files == set(kustomization["resources"])
    return objects


def test_kubernetes_manifests_fit_together() -> None:
    objects = k8s()
    assert set(objects) == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    deployment, service, budget = (objects[k] for k in ("Deployment", "Service",
                                                       "PodDisruptionBudget"))
    spec = deployment["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert 1 <= budget["spec"]["minAvailable"] < spec["replicas"]

    pod = spec["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 90
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    (port,) = container["ports"]
    assert port["containerPort"] == PORT
    # The same command line as the image's CMD.
    assert container["args"] == exec_form(only(stages(DOCKERFILE)[-1], "CMD"))
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        check = container[probe]["httpGet"]
        assert check["path"] == path
        assert check["port"] == port["name"]
    (exposed,) = service["spec"]["ports"]
    assert exposed["targetPort"] == port["name"] and exposed["port"] == PORT

    # The ConfigMap's config.js is deploy/config.js, mounted where the command line reads it.
    config_js = objects["ConfigMap"]["data"]["config.js"]
    assert config_js == (DEPLOY / "config.js").read_text()
    parse_config(config_js)
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["mountPath"] == "/etc/changefeed"

"""The deployment files agree with the code: every setting can be configured, images are
pinned, each GPU worker holds one GPU, the services have healthchecks.

Nothing here builds or runs an image (the build machines have no Docker engine); the compose
file is parsed with PyYAML (a dependency of peft), and validated with docker-compose where
that is installed (.ci/run installs it).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from service.state.config import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"

SETTINGS = {f"NOBACKFILL_{name.upper()}": name for name in Settings.model_fields}

# Settings the workers do not receive. A worker runs Celery tasks and serves no HTTP, so these
# mean nothing there: the gateway's bind address, port, request log, numpy BLAS threads,
# the torch threads of its device lane and the interval of its applier (it writes what workers spool), and the API keys
# (checked only by the HTTP layer; keeping them off the GPU hosts exposes them less).
GATEWAY_ONLY = {
    "NOBACKFILL_HOST", "NOBACKFILL_PORT", "NOBACKFILL_ACCESS_LOG", "NOBACKFILL_BLAS_THREADS",
    "NOBACKFILL_TORCH_THREADS",
    "NOBACKFILL_ADMIN_API_KEYS", "NOBACKFILL_READ_API_KEY", "NOBACKFILL_APPLY_INTERVAL_S",
    "NOBACKFILL_DECODE_PIXEL_BUDGET", "NOBACKFILL_DECODE_WAIT_S",  # image decodes of requests
}
# Nor the settings of the first-start demo (service/bootstrap.py): only `make serve` and the
# compose file's one-shot `bootstrap` service run it; a worker never does.
BOOTSTRAP = {k for k in SETTINGS if k.startswith("NOBACKFILL_BOOTSTRAP")}
NOT_FOR_WORKERS = GATEWAY_ONLY | BOOTSTRAP
# The one setting whose value differs between services: the torch device (a GPU worker
# uses its GPU, the CPU worker the CPU, the gateway what .env says).
PER_SERVICE = {"NOBACKFILL_DEVICE"}
SECRETS = {"NOBACKFILL_QDRANT_API_KEY", "NOBACKFILL_ADMIN_API_KEYS", "NOBACKFILL_READ_API_KEY"}

INTERPOLATION = re.compile(r"^\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>.*))?\}$")
ENV_LINE = re.compile(r"^(?P<comment>#\s*)?(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # resolves the YAML anchors and merge keys


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def workers(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {name: s for name, s in services.items() if name.startswith("worker")}
    assert {"worker", "worker-cpu"} <= set(found)
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def parse_env_example() -> tuple[dict[str, str], dict[str, str]]:
    """(active NAME -> value, commented-out NAME -> value) of .env.example."""
    active: dict[str, str] = {}
    commented: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = ENV_LINE.match(line.strip())
        if not m:
            continue
        value = m["value"]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        target = commented if m["comment"] else active
        assert m["name"] not in target, f".env.example: {m['name']} twice"
        target[m["name"]] = value
    return active, commented


def interpolation(value: str) -> re.Match[str] | None:
    return INTERPOLATION.match(value)


def resolve(value: str) -> str:
    """A compose value with any ${VAR:-default} replaced by its default."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    deploy = service.get("deploy") or {}
    return ((deploy.get("resources") or {}).get("reservations") or {}).get("devices") or []


def dockerfile_stages() -> dict[str, tuple[str, list[str]]]:
    """Stage name -> (what it is built FROM, its instructions)."""
    stages: dict[str, tuple[str, list[str]]] = {}
    current: list[str] = []
    for line in re.sub(r"\\\n", " ", DOCKERFILE.read_text()).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"(?i)^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", line)
        if m:
            current = []
            stages[m[2] or f"stage{len(stages)}"] = (m[1], current)
        else:
            current.append(line)
    return stages


def assert_pinned(ref: str, where: str) -> None:
    name = ref.rsplit("/", 1)[-1]
    if "@sha256:" in ref:
        return
    assert ":" in name, f"{where}: image {ref!r} has no tag"
    tag = name.split(":", 1)[1]
    assert tag and tag != "latest" and re.search(r"\d", tag), \
        f"{where}: image {ref!r} is not pinned to a version"


# ----------------------------------------------------------------------------- settings


def test_every_setting_is_in_env_example() -> None:
    active, commented = parse_env_example()
    listed = set(active) | set(commented)
    missing = sorted(set(SETTINGS) - listed)
    assert missing == [], f".env.example lacks {missing}"
    unknown = sorted(n for n in listed if n.startswith("NOBACKFILL_") and n not in SETTINGS)
    assert unknown == [], f".env.example lists names the code does not read: {unknown}"
    assert not set(active) & set(commented)


def test_every_compose_variable_is_documented() -> None:
    active, commented = parse_env_example()
    used = set()
    for path in (COMPOSE, *sorted((ROOT / "deploy").glob("compose*.yml"))):
        text = "\n".join(x for x in path.read_text().splitlines()
                         if not x.lstrip().startswith("#"))
        used |= set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    assert sorted(used - set(active) - set(commented)) == [], "not in .env.example"


def test_gateway_receives_every_setting(services: dict[str, dict[str, Any]]) -> None:
    env = environment(services["gateway"])
    names = {k for k in env if k.startswith("NOBACKFILL_")}
    assert sorted(set(SETTINGS) - names) == [], "settings missing from the gateway"
    assert sorted(names - set(SETTINGS)) == [], "the gateway gets names the code does not read"


def test_workers_receive_every_setting_but_the_gateway_only_ones(
        services: dict[str, dict[str, Any]], workers: dict[str, dict[str, Any]]) -> None:
    assert GATEWAY_ONLY <= set(SETTINGS), "GATEWAY_ONLY names a setting that no longer exists"
    gateway = environment(services["gateway"])
    for name, service in workers.items():
        env = environment(service)
        names = {k for k in env if k.startswith("NOBACKFILL_")}
        assert sorted(set(SETTINGS) - NOT_FOR_WORKERS - names) == [], f"{name} lacks settings"
        assert sorted(names & NOT_FOR_WORKERS) == [], f"{name} gets settings it never reads"
        assert sorted(names - set(SETTINGS)) == [], f"{name} gets names the code does not read"
        for key in names - PER_SERVICE:
            # The same broker, queue, registry and Qdrant as the gateway, or jobs go nowhere.
            assert env[key] == gateway[key], f"{name}: {key} differs from the gateway's"
        expected = "cuda" if gpu_devices(service) else "cpu"
        assert env["NOBACKFILL_DEVICE"] == expected, name


def test_bootstrap_service_runs_the_demo_against_the_stack(
        services: dict[str, dict[str, Any]]) -> None:
    from service.stack.bootstrap import bootstrap  # the function its command calls

    assert callable(bootstrap)
    service = services["bootstrap"]
    assert service["profiles"] == ["demo"] and service["restart"] == "no"
    assert "from service.stack.bootstrap import bootstrap" in " ".join(service["command"])
    env = environment(service)
    gateway = environment(services["gateway"])
    assert {k for k in env if k.startswith("NOBACKFILL_")} == set(SETTINGS) - GATEWAY_ONLY
    assert all(env[k] == gateway[k] for k in env if k.startswith("NOBACKFILL_"))


def test_env_example_and_compose_agree(services: dict[str, dict[str, Any]]) -> None:
    """An active .env.example line is read by compose; a commented one is fixed by it."""
    active, commented = parse_env_example()
    gateway = environment(services["gateway"])
    for key in SETTINGS:
        assert key in gateway, f"the gateway lacks {key}"
        value = gateway[key]
        m = interpolation(value)
        if m is None:  # fixed by the compose file: documented, commented out, same value
            assert key in commented, f"{key} is fixed ({value!r}): comment it out in .env.example"
            assert commented[key] == value, f".env.example shows {key}={commented[key]!r}, " \
                                            f"compose fixes {value!r}"
            continue
        assert m["name"] == key, f"gateway: {key} reads ${{{m['name']}}}"
        assert key in active, f"{key} comes from .env: give it an active line in .env.example"
        if m["op"] == ":?":
            assert key in SECRETS and "change-me" in active[key], key
        elif m["arg"]:
            assert active[key] == m["arg"], f"{key}: .env.example and compose's default differ"
    for key in SECRETS:
        assert active.get(key, "") in ("", "change-me") or "change-me" in active[key], \
            f".env.example: {key} must be empty or a change-me placeholder"


def test_env_example_values_are_valid_and_document_the_code_defaults(
        services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Values left to the code (compose passes `${X:-}`) must be the code's own defaults, and
    every value must be accepted by the settings class."""
    for key in list(os.environ):
        if key.startswith("NOBACKFILL_"):
            monkeypatch.delenv(key)
    defaults = Settings()
    active, _ = parse_env_example()
    for key, value in active.items():
        if key.startswith("NOBACKFILL_") and value != "":  # the entrypoint unsets empty ones
            monkeypatch.setenv(key, value)
    configured = Settings()  # raises if a value is invalid (bad JSON, out of range, ...)
    gateway = environment(services["gateway"])
    for key, field in SETTINGS.items():
        m = interpolation(gateway.get(key, ""))
        if m is not None and m["op"] == ":-" and m["arg"] == "":
            assert getattr(configured, field) == getattr(defaults, field), \
                f".env.example: {key}={active[key]!r} is not the code's default"


def test_entrypoint_unsets_empty_settings() -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NOBACKFILL_A": "",
           "NOBACKFILL_B": "x", "OTHER": ""}
    out = subprocess.run(["sh", str(ENTRYPOINT), "env"], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert "NOBACKFILL_B=x" in out and "OTHER=" in out
    assert not any(line.startswith("NOBACKFILL_A=") for line in out)


# ----------------------------------------------------------------------------- images


def test_every_image_is_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        assert "image" in service, f"{name} has no image"
        assert_pinned(resolve(service["image"]), f"docker-compose.yml {name}")
    stages = dockerfile_stages()
    for stage, (base, _) in stages.items():
        if base not in stages:
            assert_pinned(base, f"deploy/Dockerfile stage {stage}")


def test_qdrant_server_matches_the_client() -> None:
    """qdrant-client warns when the server's minor version is more than one away."""
    pins = dict(line.split("==") for line in CONSTRAINTS.read_text().split()
                if "==" in line)
    client = [int(x) for x in pins["qdrant-client"].split(".")[:2]]
    tag = yaml.safe_load(COMPOSE.read_text())["services"]["qdrant"]["image"].split(":")[1]
    server = [int(x) for x in tag.lstrip("v").split(".")[:2]]
    assert server[0] == client[0] and abs(server[1] - client[1]) <= 1, (tag, client)


def test_images_are_built_from_the_project(services: dict[str, dict[str, Any]],
                                           workers: dict[str, dict[str, Any]]) -> None:
    stages = dockerfile_stages()
    targets = {"gateway": services["gateway"], **workers}
    for name, service in targets.items():
        build = service["build"]
        assert (ROOT / build.get("context", ".") / build["dockerfile"]).resolve() == DOCKERFILE
        assert build["target"] in stages, name
    assert services["gateway"]["build"]["target"] == "gateway"
    assert all(s["build"]["target"] == "worker" for s in workers.values())

    def chain(stage: str) -> list[str]:
        lines: list[str] = []
        while stage in stages:
            base, own = stages[stage]
            lines = own + lines
            stage = base
        return lines

    for target, module in (("gateway", "service"), ("worker", "worker")):
        lines = chain(target)
        cmd = [x for x in lines if x.upper().startswith("CMD")][-1]
        assert f'"-m", "{module}"' in cmd, cmd
        user = [x.split()[1] for x in lines if x.upper().startswith("USER ")]
        assert user and user[-1].split(":")[0] not in ("root", "0"), f"{target} runs as root"
    # Dependencies come from pyproject.toml (`pip install .`), at the tested versions.
    runs = [x for _, lines in stages.values() for x in lines]
    assert any(x.startswith("COPY deploy/constraints.txt") for x in runs)
    assert any(re.search(r"pip install .*-c \S*constraints\.txt \.", x) for x in runs)


def test_dockerignore_lets_the_copied_files_through() -> None:
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().split()
               if line.startswith("!")}
    assert "*" in (ROOT / ".dockerignore").read_text().split(), "allowlist: exclude all first"
    for _, lines in dockerfile_stages().values():
        for line in lines:
            parts = line.split()
            if parts[0].upper() != "COPY" or any(p.startswith("--from") for p in parts):
                continue
            for src in parts[1:-1]:
                assert src.rstrip("/") in allowed, f".dockerignore keeps out {src}"
                assert (ROOT / src).exists(), src


def test_images_get_every_data_file() -> None:
    """The images install the project non-editable: a file that is not Python reaches them
    only through [tool.setuptools.package-data] (e.g. the model configs, the web page)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = project["tool"]["setuptools"].get("package-data", {})
    missing = []
    for top in ("training", "service", "worker"):
        for path in (ROOT / top).rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT).as_posix()
            if not any(rel.startswith(pkg.replace(".", "/") + "/") and fnmatch.fnmatch(
                    rel[len(pkg) + 1:], pattern)
                       for pkg, patterns in package_data.items() for pattern in patterns):
                missing.append(rel)
    assert missing == [], f"not in [tool.setuptools.package-data], so not in the images: {missing}"


def test_constraints_satisfy_the_project_requirements() -> None:
    pins = {canonicalize_name(a): b for a, b in (line.split("==") for line in
            CONSTRAINTS.read_text().split() if "==" in line)}
    for line in metadata.requires("nobackfill") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # dev extras
        name = canonicalize_name(req.name)
        assert name in pins, f"deploy/constraints.txt lacks {name}: run " \
                             "deploy/freeze_constraints.py"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"deploy/constraints.txt pins {name}=={pins[name]}, pyproject wants {req}"


# ----------------------------------------------------------------------------- GPUs


def test_each_gpu_worker_reserves_exactly_one_gpu(workers: dict[str, dict[str, Any]]) -> None:
    ids: list[str] = []
    for name, service in workers.items():
        devices = gpu_devices(service)
        if name == "worker-multigpu":  # test_the_multi_gpu_worker_holds_several_gpus
            continue
        if name == "worker-cpu":
            assert devices == [] and service["profiles"] == ["cpu"]
            continue
        assert len(devices) == 1, name
        (device,) = devices
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"], name
        assert "count" not in device and len(device["device_ids"]) == 1, \
            f"{name}: one worker process per GPU, chosen by id"
        ids.append(str(device["device_ids"][0]))
        assert service["hostname"].endswith(f"-gpu{ids[-1]}"), f"{name}: hostname names its GPU"
        # GPU 0's worker starts by default; the others are opt-in per host.
        assert ("profiles" in service) == (name != "worker"), name
    assert "0" in ids and len(ids) == len(set(ids)), f"GPU ids {ids}"
    # Celery node names (worker@hostname) stay put across restarts and differ between workers.
    hostnames = [s["hostname"] for s in workers.values()]
    assert len(hostnames) == len(set(hostnames))


def test_the_multi_gpu_worker_holds_several_gpus(workers: dict[str, dict[str, Any]]) -> None:
    """One worker for jobs with params.gpus > 1: several GPUs by id, opt-in by profile."""
    service = workers["worker-multigpu"]
    (device,) = gpu_devices(service)
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "count" not in device and [str(i) for i in device["device_ids"]] == ["0", "1", "2", "3"]
    assert service["profiles"] == ["multigpu"] and service["hostname"].endswith("-gpus0-3")
    assert environment(service)["NOBACKFILL_DEVICE"] == "cuda"


# ----------------------------------------------------------------------------- health


def test_healthchecks(services: dict[str, dict[str, Any]]) -> None:
    def check(name: str) -> str:
        test = services[name]["healthcheck"]["test"]
        return " ".join(test) if isinstance(test, list) else test

    qdrant = check("qdrant")
    assert "/dev/tcp/127.0.0.1/6333" in qdrant and "/readyz" in qdrant
    assert "curl" not in qdrant and "wget" not in qdrant, "the qdrant image has neither"
    assert "redis-cli ping" in check("redis")
    gateway = check("gateway")
    assert "urllib" in gateway and "/readyz" in gateway
    port = environment(services["gateway"])["NOBACKFILL_PORT"]
    assert f"127.0.0.1:{port}/readyz" in gateway
    assert any(p.endswith(f":{port}") for p in services["gateway"]["ports"])
    for name in ("gateway", "worker"):
        deps = services[name]["depends_on"]
        for dep in ("qdrant", "redis"):
            assert deps[dep]["condition"] == "service_healthy", (name, dep)


def test_state_is_persistent_and_shared(compose: dict[str, Any],
                                        services: dict[str, dict[str, Any]],
                                        workers: dict[str, dict[str, Any]]) -> None:
    volumes = set(compose["volumes"])

    def mounts(service: dict[str, Any]) -> dict[str, str]:
        return {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}

    assert mounts(services["qdrant"])["/qdrant/storage"] in volumes
    redis = services["redis"]
    assert mounts(redis)["/data"] in volumes
    assert "--appendonly yes" in " ".join(redis["command"])
    data = environment(services["gateway"])["NOBACKFILL_DATA_DIR"]
    assert environment(services["gateway"])["NOBACKFILL_REGISTRY_ROOT"].startswith(data + "/")
    shared = mounts(services["gateway"])[data]
    assert shared in volumes
    for name, service in workers.items():
        assert mounts(service)[data] == shared, f"{name} must share the registry volume"
    # Qdrant gets the same API key as the code (one .env variable).
    assert services["qdrant"]["environment"]["QDRANT__SERVICE__API_KEY"] == \
        environment(services["gateway"])["NOBACKFILL_QDRANT_API_KEY"]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_accepts_the_files() -> None:
    for files in (["docker-compose.yml"], ["docker-compose.yml", "deploy/compose.gateway-gpu.yml"]):
        args = ["docker-compose", "--env-file", ".env.example"]
        for f in files:
            args += ["-f", f]
        result = subprocess.run(args + ["config", "-q"], cwd=ROOT, capture_output=True,
                                text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr

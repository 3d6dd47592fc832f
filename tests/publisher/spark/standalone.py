"""A Spark standalone cluster on loopback, from the installed pyspark package, and what a job
shipped to it needs: the project as a zip for `--py-files`, and a Python without the project.

    with StandaloneCluster(directory) as cluster:      # a master and one worker
        job = cluster.submit(script, args, py_files=[zip_path], python=executor_python)

The master and the worker are `spark-class` JVMs with SPARK_HOME the pyspark package's
directory; each is ready when it logs so (the master elected leader, the worker registered), never
after a sleep. Every JVM is terminated on exit (the worker takes its executors with it).
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import time
import tomllib
import venv
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import pyspark

from changefeed_testing.servers import drain, scaled, terminate, wait_for_line

SPARK_HOME = Path(pyspark.__file__).parent
ROOT = Path(__file__).resolve().parents[3]

PACKAGES = ("changefeed", "publisher", "listener")
"""What executors import: the shared core, the publisher (the sink) and its static registration
(`pyspark_changefeed`); the listener rides along (a job may also listen)."""

_DAEMON_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dspark.master.rest.enabled=false"
"""The master and the worker do little: a small heap (SPARK_DAEMON_MEMORY), a quick start."""


def jvm_environment(**extra: str) -> dict[str, str]:
    """The environment of the cluster's JVMs: SPARK_HOME the pyspark package, bound to loopback,
    and nothing of this process's Python path (a `PYTHONPATH` naming the checkout would give the
    executors the project without `--py-files`)."""
    env = {
        key: value for key, value in os.environ.items()
        if not key.startswith(("PYSPARK_", "SPARK_")) and key != "PYTHONPATH"
    }
    env.update(
        SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", SPARK_DAEMON_MEMORY="256m",
        SPARK_DAEMON_JAVA_OPTS=_DAEMON_OPTIONS, SPARK_NO_DAEMONIZE="1",
    )
    env.update(extra)
    return env


def package_zip(path: Path) -> Path:
    """The project as `--py-files` takes it: its packages and top-level modules at the root of a
    zip, with the distribution's metadata (`publisher.__version__` reads it), as in its wheel."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    info = f"{project['name']}-{project['version']}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in PACKAGES:
            for file in sorted((ROOT / package).rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts:
                    archive.write(file, file.relative_to(ROOT).as_posix())
        for module in ("pyspark_changefeed.py", "changefeed_cli.py"):
            archive.write(ROOT / module, module)
        archive.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n",
        )
        archive.writestr(f"{info}/top_level.txt", "\n".join([*PACKAGES, "pyspark_changefeed"]))
    return path


def python_without_project(directory: Path) -> Path:
    """A Python environment that has the project's dependencies (this one's site-packages, by a
    path in a .pth file) but not the project: the .pth files of that directory, among them the
    editable install's import hook, are not run for a directory added that way. What a worker
    with the dependencies installed and the project shipped by `--py-files` looks like."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(directory)
    found = [Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site,) = directory.glob("lib/python*/site-packages")
    (site / "dependencies.pth").write_text("".join(f"{p}\n" for p in found))
    python = directory / "bin" / "python"
    check = subprocess.run([str(python), "-c", "import pyarrow, redis, publisher"],
                           capture_output=True, text=True, cwd=directory, env=jvm_environment())
    assert "No module named 'publisher'" in check.stderr, check.stderr
    return python


class StandaloneCluster:
    """A standalone master and one worker (`cores` cores, `memory` for executors) on 127.0.0.1."""

    MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")

    def __init__(self, directory: Path, *, cores: int = 2, memory: str = "768m") -> None:
        self.directory = directory
        self.cores = cores
        self.memory = memory
        self.url = ""
        self.processes: list[subprocess.Popen[bytes]] = []
        self.lines: dict[str, list[str]] = {}
        self._worker: subprocess.Popen[bytes] | None = None
        self._worker_ready = False

    def _launch(self, role: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args], env=jvm_environment(),
            cwd=self.directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self.processes.append(process)
        self.lines[role] = []
        return process

    def _ready(self, role: str, process: subprocess.Popen[bytes], ready: str) -> str:
        line = wait_for_line(process, self.lines[role], 60, lambda line: ready in line)
        if line is None:
            raise RuntimeError(f"the Spark {role} did not start:\n" + "".join(self.lines[role]))
        return line

    def __enter__(self) -> StandaloneCluster:
        self.start()
        self.wait_for_worker()
        return self

    def start(self) -> StandaloneCluster:
        """Start the master and, once it leads, the worker; `wait_for_worker()` (or `submit`)
        waits for the worker to register, so a job's driver can start meanwhile."""
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            master = self._launch("master", ["org.apache.spark.deploy.master.Master",
                                             "--host", "127.0.0.1", "--port", "0",
                                             "--webui-port", "0"])
            self._ready("master", master, "elected leader")
            url = self.MASTER_URL.search("".join(self.lines["master"]))
            assert url is not None, self.lines["master"]
            self.url = url.group(1)
            self._worker = self._launch("worker", [
                "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                "--port", "0", "--webui-port", "0", "--cores", str(self.cores),
                "--memory", self.memory, "--work-dir", str(self.directory / "work"),
            ])
        except BaseException:
            self.stop()
            raise
        return self

    def wait_for_worker(self) -> None:
        """Return once the worker registered with the master (raise if it exits first)."""
        if not self._worker_ready:
            assert self._worker is not None, "start() first"
            self._ready("worker", self._worker, "Successfully registered with master")
            self._worker_ready = True

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """The worker first (it kills its executors), then the master."""
        for process in reversed(self.processes):
            terminate(process, 15)

    def submit_command(
        self, script: Path, args: Sequence[str], *, py_files: Sequence[Path],
        conf: Mapping[str, str],
    ) -> list[str]:
        """The `spark-submit` command line of a Python job on this cluster (client mode)."""
        command = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.url,
                   "--py-files", ",".join(str(p) for p in py_files)]
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        return [*command, str(script), *args]

    def submit(
        self, script: Path, args: Sequence[str], *, py_files: Sequence[Path], python: Path,
        conf: Mapping[str, str], seconds: float,
    ) -> subprocess.CompletedProcess[str]:
        """Run the job with `python` as the driver's and the executors' Python; returns once it
        ended (its output in `.stdout`), terminating it after the scaled `seconds`."""
        command = self.submit_command(script, args, py_files=py_files, conf=conf)
        env = jvm_environment(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
        process = subprocess.Popen(command, env=env, cwd=self.directory, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)
        self.processes.append(process)
        lines: list[str] = []
        arrived: queue.Queue[str | None] = queue.Queue()
        drain(process, lines, arrived)
        try:
            self.wait_for_worker()  # the driver starts meanwhile; its executor once it is up
            deadline = time.monotonic() + scaled(seconds)
            while arrived.get(timeout=max(deadline - time.monotonic(), 0)) is not None:
                pass  # the job's output, until it exits
        except queue.Empty:
            pass  # too slow: terminated below, its output so far returned
        finally:
            terminate(process, 15)
        return subprocess.CompletedProcess(command, process.returncode, "".join(lines), "")

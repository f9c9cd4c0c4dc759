"""`invoke fetch` against OpenSSH's `scp` followed by `sha256sum -c`, and the pipeline's save on the
host against `cp` followed by `sha256sum`, on one throwaway host.

    sudo uv run python -m benchmarks.fetch_speed [--gb 2] [--files 4] [--runs 3] [--rtt-ms MS] [--json]

In one run, against ONE throwaway host (as benchmarks/provision_noop.py makes it: tests/host/rootfs.py, its
sshd on 127.0.0.1, behind a relay adding --rtt-ms if given):

1. write a model of --files files of random bytes, --gb GB in all, into /dev/shm on the host, and
   save it to ~/tpu-grpo/models/bench with the pipeline's own save script (SHA256SUMS), as
   `invoke pipeline` leaves a trained model;
2. time N rounds; each round times, one after the other, into fresh local folders:
   - `invoke fetch --run bench` (the whole CLI process): the figure;
   - `scp -r` of the same folder, then `sha256sum -c SHA256SUMS` in it: the baseline;
   - `invoke fetch` without OpenSSH's client on PATH (its paramiko SFTP path), shown;
   - on the host, the save script again (replace) against `cp -a` then `sha256sum` of the copy;
3. print each median, and the ratios fetch / (scp + sha256sum -c) and save / (cp + sha256sum);
4. remove everything it made, even on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.provision_noop import MADE_UP_TOKEN, BenchError, make_host, say
from tpu_grpo.host import artifacts

ROOT = Path(__file__).resolve().parent.parent
RUN = "bench"


def on_host(host, script: str) -> subprocess.CompletedProcess:
    """A bash script as the host's user, over SSH (as the tools reach it)."""
    return subprocess.run(
        ["ssh", *ssh_options(host), f"{host.user.name}@{host.vm.address}", "bash", "-s"],
        input=script,
        capture_output=True,
        text=True,
        check=True,
    )


def ssh_options(host) -> list[str]:
    return [
        "-i",
        str(host.key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={host.state / 'known_hosts'}",
        "-o",
        "LogLevel=ERROR",
        "-p",
        str(host.port),
    ]


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def invoke_fetch(host, to: Path, path: str) -> None:
    env = {**os.environ, "TPU_GRPO_STATE": str(host.state), "HF_TOKEN": MADE_UP_TOKEN, "PATH": path}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "-r",
            str(ROOT),
            "fetch",
            "--run",
            RUN,
            "--to",
            str(to),
            "--host",
            host.spec,
            "--identity",
            str(host.key),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if result.returncode != 0 or json.loads(result.stdout)["bytes_transferred"] == 0:
        raise BenchError(f"invoke fetch failed: {result.stderr[-500:]}")


def scp_and_check(host, to: Path) -> None:
    subprocess.run(
        [
            "scp",
            "-q",
            "-r",
            *ssh_options(host)[:-2],
            "-P",
            str(host.port),
            f"{host.user.name}@{host.vm.address}:tpu-grpo/models/{RUN}",
            str(to),
        ],
        check=True,
    )
    subprocess.run(["sha256sum", "-c", "--quiet", artifacts.SUMS], cwd=to, check=True)


def host_seconds(host, script: str) -> float:
    """Seconds a script takes on the host, timed there (the SSH round trip aside)."""
    done = on_host(host, f"start=$(date +%s%N)\n( {script}\n) > /dev/null\necho TOOK $(( $(date +%s%N) - start ))")
    return int(done.stdout.split("TOOK")[-1]) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("run as root (it makes a throwaway host): sudo uv run python -m benchmarks.fetch_speed")
    with contextlib.ExitStack() as stack:
        host = make_host(stack, args.rtt_ms)
        local = Path(tempfile.mkdtemp(prefix="tpu-grpo-fetch-"))
        stack.callback(shutil.rmtree, local, True)
        each_mb = int(args.gb * 1024 / args.files)
        source = "/dev/shm/bench-model"
        say(f"writing {args.files} files of {each_mb} MiB into {source} on the host, then saving them")
        save = artifacts.save_script(source, f"~/tpu-grpo/models/{RUN}", replace=True)
        on_host(
            host,
            f"mkdir -p {source} ~/tpu-grpo/models && for i in $(seq {args.files}); do "
            f"head -c {each_mb}M /dev/urandom > {source}/model-$i.safetensors; done\n"
            f"echo '{{}}' > {source}/config.json\n{save}",
        )
        without_ssh = local / "bin"  # a PATH without OpenSSH's client: fetch then uses paramiko's SFTP
        without_ssh.mkdir()
        times: dict[str, list[float]] = {
            "fetch": [],
            "scp + sha256sum -c": [],
            "fetch over paramiko SFTP": [],
            "save": [],
            "cp + sha256sum": [],
        }
        for number in range(args.runs):
            say(f"round {number + 1} of {args.runs}")
            times["fetch"].append(timed(lambda: invoke_fetch(host, local / f"ours-{number}", os.environ["PATH"])))
            times["scp + sha256sum -c"].append(timed(lambda: scp_and_check(host, local / f"scp-{number}")))
            times["fetch over paramiko SFTP"].append(
                timed(lambda: invoke_fetch(host, local / f"sftp-{number}", str(without_ssh)))
            )
            for folder in (f"ours-{number}", f"scp-{number}", f"sftp-{number}"):
                shutil.rmtree(local / folder)
            times["save"].append(host_seconds(host, save))
            times["cp + sha256sum"].append(
                host_seconds(
                    host,
                    f"rm -rf ~/bench-cp && cp -a {source} ~/bench-cp && (cd ~/bench-cp && sha256sum -- * > /dev/null)",
                )
            )
        medians = {name: statistics.median(values) for name, values in times.items()}
        result = {
            "gb": args.gb,
            "files": args.files,
            "runs": args.runs,
            "rtt_ms": args.rtt_ms,
            "median_s": medians,
            "fetch_ratio": medians["fetch"] / medians["scp + sha256sum -c"],
            "save_ratio": medians["save"] / medians["cp + sha256sum"],
        }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, seconds in medians.items():
            print(f"{name:28s} {seconds:7.2f} s")
        print(f"fetch / (scp + sha256sum -c) = {result['fetch_ratio']:.2f}x (goal: at most 1.25x)")
        print(f"save / (cp + sha256sum)      = {result['save_ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

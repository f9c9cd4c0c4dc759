"""The tutorial's sections 4 to 6 run for real in bash, with `python3` recording what it is
given: the argv and environment each MaxText step gets when a person follows the tutorial."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.conftest import TUTORIAL

MODULES = ("maxtext.checkpoint_conversion.to_maxtext", "maxtext.trainers.post_train.rl.train_rl",
           "maxtext.checkpoint_conversion.to_huggingface")


def sections() -> str:
    """The code blocks of sections 4, 5 and 6, in order, as one shell session."""
    text = TUTORIAL.read_text()
    blocks = []
    for number in (4, 5, 6):
        section = re.search(rf"^## {number}\..*?^```\n(.*?)^```", text, re.S | re.M)
        blocks.append(section.group(1))
    return "".join(blocks)


def calls(folder: Path, token: str, run_name: str) -> dict[str, dict]:
    """module -> {"argv": [...], "env": {...}} as the tutorial's shell would run them, with `date`
    answering `run_name` (the tutorial's RUN_NAME) and the token in place of YOUR_HF_TOKEN."""
    tools = folder / "tutorial-bin"
    tools.mkdir(exist_ok=True)
    record = folder / "tutorial-calls.jsonl"
    (tools / "python3").write_text(
        "#!/usr/bin/python3\nimport json, os, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], 'env': dict(os.environ)}}) + '\\n')\n")
    (tools / "date").write_text(f"#!/bin/sh\necho {run_name}\n")
    for tool in ("python3", "date"):
        (tools / tool).chmod(0o755)
    script = sections().replace("YOUR_HF_TOKEN", token)
    subprocess.run(["bash", "-c", script], check=True, env={"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(folder)})
    found = {}
    for line in record.read_text().splitlines():
        call = json.loads(line)
        dash_m, module, *argv = call["argv"]
        assert dash_m == "-m"
        found[module] = {"argv": argv, "env": call["env"]}
    return found


def exported_names() -> list[str]:
    """Every variable the tutorial's sections 4-6 export, in order."""
    names = []
    for line in sections().splitlines():
        match = re.match(r"^(?:export ([A-Z_]+)=|[A-Z_]+=.*; export ([A-Z_]+)$)", line)
        if match:
            names.append(match.group(1) or match.group(2))
    return names

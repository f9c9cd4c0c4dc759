"""The README and its pages in docs/ stay true: every setting documented, every link landing on a heading, the
test command the one CI runs."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import ROOT, invoke
from tpu_grpo.config.keys import KEYS

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: The command line's rules, the exit codes and the --json list: linked from the README, said only there.
REFERENCE = ROOT / "docs/reference.md"


def documentation() -> str:
    """The README and every page of docs/, as one text: what the tests below hold true."""
    return "\n".join(page.read_text() for page in PAGES)


def anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def test_every_link_between_the_pages_lands_on_a_heading():
    anchors = {
        page: {anchor(line.lstrip("#").strip()) for line in page.read_text().splitlines() if line.startswith("#")}
        for page in PAGES
    }
    broken = []
    for page in PAGES:
        for target, fragment in re.findall(r"\]\(([^)#\s]*\.md|)#([^)]+)\)", page.read_text()):
            where = (page.parent / target).resolve() if target else page
            if where not in anchors or fragment not in anchors[where]:
                broken.append(f"{page.name}: {target}#{fragment}")
    assert broken == []
    readme = (ROOT / "README.md").read_text()
    assert all(f"(docs/{page.name})" in readme for page in PAGES[1:])  # the README maps every page


def test_the_readme_is_what_a_newcomer_reads_first():
    """What it is in one paragraph, what you need before the first command, what it costs, the commands from nothing
    to a model with `down` beside them (the offline plan first), the tests' command, the map of docs/; short enough
    to read in two minutes, the reference material on its own page."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme) < 8_000 and "| code | meaning |" not in readme and "┏" not in readme
    sections = re.findall(r"^## (.+)$", readme, re.MULTILINE)
    assert sections[:3] == ["What you need", "What it costs", "From nothing to a model"], sections
    intro = readme.split("\n## ", 1)[0].split("\n\n")
    assert len(intro) == 2  # the title and one paragraph
    blocks = readme[readme.index("## From nothing to a model") :].split("```")[1::2]
    settings_block, steps = blocks[0], blocks[1]
    import yaml

    assert {  # the cheap first run's, beside the `pulumi config set` lines that write them
        key: value
        for key, value in yaml.safe_load(settings_block.removeprefix("yaml"))["config"].items()
        if key in FIRST_RUN
    } == FIRST_RUN
    assert all(f"pulumi config set {key} {value}" in settings_block for key, value in FIRST_RUN.items())
    assert [line.split("#")[0].split()[3] for line in steps.strip().splitlines()] == [
        "plan", "up", "provision", "pipeline", "fetch", "down",
    ]  # fmt: skip
    assert readme.index("## What you need") < readme.index("uv run invoke up")
    assert readme.index("uv run invoke plan") < readme.index("uv run invoke up provision --wait 120 pipeline")
    assert "```\ntests/run\n```" in readme and "## Documentation" in readme


@pytest.fixture
def default_cost(stack_values, tmp_path, monkeypatch) -> dict:
    """What the committed stack (the tutorial's reservation-bound v6e-8) costs, as `invoke plan --json` says it."""
    import yaml

    from tpu_grpo.cli import plan

    folder = tmp_path / "default"
    folder.mkdir()
    (folder / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (folder / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": stack_values}))
    monkeypatch.chdir(folder)
    return plan.build("dev").to_json()["cost"]


def test_the_readmes_costs_are_what_plan_says(first_run, default_cost):
    """The front page's prices: the default stack's (a reservation-bound v6e-8) and the cheap first run's, each as
    `invoke plan` works it out."""
    cost = default_cost
    words = " ".join((ROOT / "README.md").read_text().split()).split("## What it costs", 1)[1].split("##")[0]
    assert f"{cost['chips']} chips × ${cost['usd_per_chip_hour']:.2f} = ${cost['usd_per_hour']:.2f} an hour" in words
    assert f"its disks ${cost['disks_usd_per_hour']:.3f} an hour" in words
    cheap = first_run["cost"]
    assert f"costs ${cheap['usd_per_hour']:.2f} an hour while the VM runs" in words
    assert f"${cheap['disks_usd_per_hour']:.3f} an hour for its disks until `down`" in words


def test_each_fact_is_said_once_and_linked_from_elsewhere():
    """What a stopped TPU VM becomes, what `down` refuses, and that the token is on no command line: each said on one
    page (settings.md, results.md, training.md), the others link there."""
    text = " ".join(documentation().split()).lower()
    assert text.count("started again:") + text.count("never started again") == 1
    assert text.count("refuses to run `pulumi destroy` while") == 1 and "refuses while a trained" not in text
    assert text.count("never travels on a command line") == 1 and "on no command line" not in text
    assert "(settings.md#what-pulumi-up-creates)" in text and "(training.md#the-token)" in text


def test_one_table_of_roles():
    """The IAM roles a path needs are one table (settings.md), which the other pages link; no page asks for roles
    the program does not need (the Cloud TPU API's TPU Admin, Compute Editor)."""
    pages = {page.name: page.read_text() for page in PAGES}
    assert [name for name, text in pages.items() if "| path | roles |" in text] == ["settings.md"]
    assert "Compute Editor" not in documentation()
    assert "(settings.md#roles)" in pages["first-run.md"] and "(docs/settings.md#roles)" in pages["README.md"]


def test_the_readmes_plot_is_drawn_by_the_command_it_gives():
    """The README's plot is MaxText 0.2.3's recorded run, drawn by the command beside it: run as printed, it writes
    that PNG, titled by the run its alt text names, with the evaluations the recorded log holds."""
    import shlex

    from tpu_grpo.results import metrics

    readme = " ".join((ROOT / "README.md").read_text().split())
    command = re.search(r"drawn by `(uv run invoke metrics [^`]+)`", readme)[1]
    picture = re.search(r"!\[[^\]]+\]\(([^)]+)\)", readme)[1]
    argv = shlex.split(command)
    assert argv[argv.index("--out") + 1] == picture
    committed = (ROOT / picture).read_bytes()
    try:
        done = subprocess.run([*argv, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    finally:
        (ROOT / picture).write_bytes(committed)
    import json

    drawn = json.loads(done.stdout)
    assert drawn["plot"] == picture and drawn["run"] == "maxtext-0.2.3" and "MaxText 0.2.3's recorded run" in readme
    recorded = metrics.evals_from_log((ROOT / argv[argv.index("--log") + 1]).read_text())
    assert recorded and len(drawn["evals"]) == len(recorded)


def test_the_slice_settings_values_are_what_settings_shows(stack_dir, stack_values):
    """docs/settings.md's slice row names what `invoke settings` shows for the one VM: its machine's accelerator
    type (v6e-1 on a one-chip machine), not only v6e-8."""
    import json

    import yaml

    from tpu_grpo.catalog.accelerators import MACHINES

    row = next(line for line in (ROOT / "docs/settings.md").read_text().splitlines() if "| `tpu-grpo:slice` |" in line)
    assert all(f"`{machine.accelerator_type}`" in row for machine in MACHINES.values())
    config = {**stack_values, "tpu-grpo:machineType": "ct6e-standard-1t", "tpu-grpo:model": "qwen3-0.6b"}
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": config}))
    shown = json.loads(invoke("settings", "--json", cwd=stack_dir).stdout)["settings"]["tpu-grpo:slice"]
    assert shown["value"] == "v6e-1" and "`v6e-1`" in row


def test_readme_documents_every_setting():
    readme = documentation()
    rows = {line.split("|")[1].strip().strip("`") for line in readme.splitlines() if line.startswith("| `")}
    assert {key.name for key in KEYS} <= rows


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "```\ntests/run\n```" in readme
    assert ci.rstrip().splitlines()[-1] == "tests/run"
    assert "tests/install-host-packages" in ci  # the one list of Debian packages, as tests/run installs it


def test_a_run_without_the_host_tiers_packages_says_so_in_one_line(tmp_path):
    """`uv run pytest` on a machine without the host tier's Debian packages (here: none on PATH) runs the unit
    tier and says in one line what is missing and the command that installs it; no traceback per test."""
    import os
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/host/test_rootfs.py"],
        cwd=ROOT,
        env={**os.environ, "PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    [line] = [line for line in result.stdout.splitlines() if line.startswith("ran the unit tier only")]
    if os.geteuid() == 0:
        assert "the host tier needs the Debian packages openssh-client, " in line and "mmdebstrap" in line
        assert line.endswith("install them: tests/install-host-packages (or run the tests with tests/run)")
    else:
        assert line.endswith("needs root; run it with: sudo tests/run")
    assert "FileNotFoundError" not in result.stdout and "Traceback" not in result.stdout


def test_example_stack_sets_every_required_key():
    import yaml

    config = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    assert {key.name for key in KEYS if key.required} <= set(config)


def test_readme_documents_provisioning_and_every_playbook_variable():
    from tpu_grpo.provision import playbook

    readme = documentation()
    for text in ("invoke provision", "--check", "--var KEY=VALUE", "invoke freeze", "--locked", "--tags"):
        assert text in readme
    assert all(f"`{name}`" in readme for name in playbook.load().vars)


def test_readme_walks_a_newcomer_through_every_task():

    readme = documentation()
    tasks = [node.name for node in task_functions()]
    assert {"pipeline", "fetch", "down", "metrics", "cancel"} <= set(tasks)
    assert all(f"invoke {name}" in readme for name in tasks), [t for t in tasks if f"invoke {t}" not in readme]
    assert "uv run invoke up provision --wait 120 pipeline --batches 50 fetch" in readme
    assert "pulumi destroy" in readme and "`HF_TOKEN`, not `hf_access_token=`" in readme


def test_readme_names_the_current_hugging_face_login():
    """huggingface_hub's CLI is `hf` now, and a newcomer's PATH has it only through the checkout's venv (`uv run hf
    auth login`), as the code says when the token is missing."""
    readme = (ROOT / "README.md").read_text()
    assert "huggingface-cli" not in readme and "`uv run hf auth login`" in readme
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        assert not re.search(r"(?<!uv run )\bhf auth login", page.read_text()), page.name


def test_the_exit_codes_are_stated_once():
    assert documentation().count("| 130 |") == 1 and "Exit codes: 2" not in documentation()


def test_the_exit_code_table_is_the_codes_the_tasks_exit_with():
    """The README's table has a row for each code the code gives: done, bad input, a failure (a host not reached or
    trusted), Ctrl-C while following, a reader gone, and the Pulumi CLI's own."""
    from tpu_grpo.config.errors import BROKEN_PIPE, INTERRUPTED, UserError
    from tpu_grpo.host.hosts import ConnectError

    readme = REFERENCE.read_text()
    table = readme[readme.index("| code | meaning |") :].split("\n\n", 1)[0]
    codes = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    bad_input = table.splitlines()[3]  # what `up` exits with for a missing Pulumi CLI (test_tasks.py) is said there
    assert "this laptop lacks" in bad_input and "the Pulumi CLI" in bad_input
    assert codes == [
        "0",
        str(UserError.exit_code),
        str(ConnectError.exit_code),
        str(INTERRUPTED),
        str(BROKEN_PIPE),
        "other",
    ]


def test_the_layout_lists_each_task_module_with_its_tasks():
    """docs/development.md names, beside each tpu_grpo/cli/*_tasks.py, exactly the tasks it defines."""
    page = (ROOT / "docs/development.md").read_text()
    modules: dict[str, set] = {}
    for node in task_functions():
        modules.setdefault(node.module, set()).add(node.name)
    for module, names in modules.items():
        [line] = [line for line in page.splitlines() if line.strip().startswith(f"{module}.py ")]
        assert set(line.split(f"{module}.py", 1)[1].replace(",", " ").split()) == names, module


def test_the_repository_points_nowhere_outside_itself():
    """A clone alone must pass its tests: no file refers to the shared folder beside the checkout."""
    tracked = subprocess.run(
        ["git", "-c", "safe.directory=*", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    outside = re.compile(r"\.\./shar[e]d|shar[e]d/(docs|fixtures|seed)|/work/shar[e]d")
    found = []
    for name in tracked:
        path = ROOT / name
        if path.suffix in (".py", ".md", ".yml", ".yaml", ".toml", ".txt", "") and path.is_file():
            found += [
                f"{name}: {line.strip()}"
                for line in path.read_text(errors="replace").splitlines()
                if outside.search(line)
            ]
    assert found == []


#: The settings docs/first-run.md's cheap first run sets on the committed example (and its reservation removed).
FIRST_RUN = {"tpu-grpo:capacity": "spot", "tpu-grpo:machineType": "ct6e-standard-1t", "tpu-grpo:model": "qwen3-0.6b"}


@pytest.fixture
def first_run(stack_values, tmp_path, monkeypatch) -> dict:
    """What docs/first-run.md's cheap run costs, as `invoke plan --json` says it, and the lines the page must hold."""
    import yaml

    from tpu_grpo.catalog.capacity import PRICES_READ
    from tpu_grpo.catalog.models import MODELS
    from tpu_grpo.cli import plan

    config = {key: value for key, value in stack_values.items() if key != "tpu-grpo:reservation"}
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": {**config, **FIRST_RUN}}))
    monkeypatch.chdir(tmp_path)
    cost = plan.build("dev").to_json()["cost"]
    (boot, data), performance = (disk["gb"] for disk in cost["disks"]), cost["disks"][1]["performance"]
    hour, disks = cost["usd_per_hour"], cost["disks_usd_per_hour"]
    model = MODELS[FIRST_RUN["tpu-grpo:model"]]
    printed = invoke("plan", cwd=tmp_path, env={"COLUMNS": "400"}).stdout.splitlines()
    lines = [
        next(line for line in printed if line.startswith("per hour: ")),  # as plan prints it
        f"the model's download: {cost['download']['model']}, about {cost['download']['gb']:g} GB "
        f"({cost['download']['what']}), onto the data disk",
        f"a boot disk of {boot} GB and a data disk of {data} GB ({performance})",
        f"prices read {PRICES_READ}",
        *(f"pulumi config set {key} {value}" for key, value in FIRST_RUN.items()),
        "pulumi config rm tpu-grpo:reservation",
    ]
    assert cost["slice"] == "v6e-1" and cost["capacity"] == "spot"
    assert cost["download"]["model"] == model.hf_id
    return {
        "cost": cost,
        "lines": lines,
        "figures": {f"${figure:.2f}" for figure in (hour, cost["usd_per_hour_total"])} | {f"${disks:.3f}"},
    }


def test_the_first_runs_settings_and_figures_are_what_plan_says(first_run):
    """The cheap first run's cost and download, from `invoke plan` on its settings and the model table."""
    page = " ".join((ROOT / "docs/first-run.md").read_text().split())
    assert [line for line in first_run["lines"] if " ".join(line.split()) not in page] == []


def test_the_first_run_maps_every_step_of_the_tutorial_and_the_keys_it_owns():
    """Each numbered section of the tutorial (tests/data) is a row of the page's map; the old command line's keys
    that tpu-grpo owns are said with what gives them, as OWNED_KEYS has it."""
    from tpu_grpo.jobs.maxtext import OWNED_KEYS

    page = (ROOT / "docs/first-run.md").read_text()
    tutorial = (ROOT / "tests/data/tutorial.md").read_text()
    sections = re.findall(r"^## ([0-9]+)\. ", tutorial, re.MULTILINE)
    assert sections and all(f"\n| {number}. " in page for number in sections)
    assert "python3 -m src.MaxText.rl.train_rl" in page
    words = " ".join(page.split())
    assert [
        key
        for key in ("tokenizer_path", "load_parameters_path", "hf_access_token")
        if f"`{key}` from {OWNED_KEYS[key]}" not in words
    ] == []


def test_every_dollar_figure_in_the_readme_is_read_from_the_capacity_table(first_run, default_cost):
    """The README types no price of its own: each figure is a capacity's price per chip-hour, a v6e-8's hour
    at it, a slice's other costs, the README's v6e-16 example, the first run's, or a moved data disk's snapshot, from
    tpu_grpo/catalog/capacity.py (the first run's through `invoke plan`)."""
    from tpu_grpo.catalog.capacity import CAPACITIES, CPU_HOST_USD_PER_HOUR, GKE_CLUSTER_USD_PER_HOUR

    prices = {row.usd_per_chip_hour for row in CAPACITIES.values()}
    known = {
        f"${figure:.2f}"
        for figure in (*prices, *(8 * price for price in prices), CPU_HOST_USD_PER_HOUR, GKE_CLUSTER_USD_PER_HOUR)
    } | first_run["figures"]
    known |= {f"${default_cost['disks_usd_per_hour']:.3f}"}
    on_demand = CAPACITIES["on-demand"].usd_per_chip_hour
    known.add(f"${16 * on_demand + CPU_HOST_USD_PER_HOUR + GKE_CLUSTER_USD_PER_HOUR:.2f}")
    known.add("$0.00")  # `invoke runs` on a test host: jobs of seconds cost nothing, whatever the price
    from tpu_grpo.catalog.capacity import SNAPSHOT_USD_PER_GB_MONTH
    from tpu_grpo.config.keys import KEY

    data_disk_gb = int(KEY["tpu-grpo:dataDiskGb"].default or 0)  # a moved data disk's snapshot, at most
    known |= {f"${SNAPSHOT_USD_PER_GB_MONTH:.3f}", f"${data_disk_gb * SNAPSHOT_USD_PER_GB_MONTH:.2f}"}
    known |= set(re.findall(r"\$[0-9][0-9,]*\.[0-9]+", "\n".join(timeline_sample()[1])))  # timeline's own output
    readme = documentation()
    figures = set(re.findall(r"\$[0-9][0-9,]*\.[0-9]+", readme))
    assert figures and figures <= known, figures - known
    table = (ROOT / "docs" / "capacity.md").read_text()  # the capacity table
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in table.splitlines()
        if line.startswith("| `") and line.split("|")[1].strip().strip("`") in CAPACITIES
    }
    assert set(rows) == set(CAPACITIES)
    for name, row in rows.items():
        capacity = CAPACITIES[name]
        assert f"${capacity.usd_per_chip_hour:.2f}" in row, name
        assert ("| preemptible |" in row) == ("preemptible" in capacity.quota), name
        assert f"| {capacity.idle_stop_minutes} min |" in row if capacity.idle_stop_minutes else "| off |" in row
        assert all(f"`{zone}`" in row for zone in capacity.zones), name  # every zone the code warns of none in


def test_invoke_list_shows_each_task_in_a_first_line_that_stands_alone():
    """`invoke --list` shows a docstring's first line: a whole sentence, never one cut mid-way."""
    import ast

    for node in task_functions():
        first = (ast.get_docstring(node, clean=False) or "").splitlines()[0]
        assert first.endswith((".", ")")) and len(first) <= 120, node.name


def task_functions() -> list:
    """Every task's function, as the task modules under tpu_grpo/cli/ define them (tasks.py gathers them)."""
    import ast

    found = []
    for path in sorted((ROOT / "tpu_grpo/cli").glob("*_tasks.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any("task" in ast.unparse(d) for d in node.decorator_list):
                node.module = path.stem  # type: ignore[attr-defined]
                found.append(node)
    return found


def _tasks_with(flag: str) -> set[str]:
    """The tasks that take `flag` (Invoke's argument name), read from their flags records."""
    import dataclasses

    import tasks

    return {
        name
        for name in tasks.ns.task_names
        if flag in {each.name for each in dataclasses.fields(tasks.ns.tasks[name].flags)}
    }


def test_the_references_json_list_is_every_task_that_takes_json():
    readme = REFERENCE.read_text()
    said = readme[readme.index("**`--json`** (on ") + len("**`--json`** (on ") :].split(")", 1)[0]
    listed = {name.split()[0] for name in re.findall(r"`([a-z-]+(?: --dry-run)?)`", said)}
    assert listed == _tasks_with("json_")


def test_the_keys_set_refuses_are_the_ones_the_code_owns():
    """docs/training.md's list of keys `--set` refuses is MaxText's keys that have a flag or setting of their own."""
    from tpu_grpo.jobs.maxtext import OWNED_KEYS

    page = (ROOT / "docs/training.md").read_text()
    said = page[page.index("Keys with a flag or setting of their own (") :].split(") are refused", 1)[0]
    assert set(re.findall(r"`([a-z_.]+)`", said)) == set(OWNED_KEYS)
    example = re.search(r"a value may hold colons: `--set (train:[^=]+)=", page)
    assert example and example[1].split(":")[1] not in OWNED_KEYS  # an example the code takes


def test_the_stack_outputs_documented_are_the_programs():
    from infra import offline

    page = (ROOT / "docs/settings.md").read_text()
    said = page[page.index("Stack outputs (`pulumi stack output --json`): ") :].split(". ", 1)[0]
    import yaml

    raw = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    _, _, outputs = offline.run(raw, "dev", lenient=True)
    assert set(re.findall(r"`([a-z_]+)`", said)) == set(outputs)


def test_the_settings_table_says_which_keys_a_stack_must_set_and_each_default():
    """docs/settings.md's table is the keys, whole and in their order (StackValues'), and its second column says
    `yes` (or `one VM`) exactly for those a stack must set, and `no: VALUE` with the default the code gives."""
    page = (ROOT / "docs/settings.md").read_text()
    rows = {
        cells[1].strip("` "): cells[2].strip()
        for line in page.splitlines()
        if line.startswith("| `") and ":" in line.split("|")[1]
        for cells in [line.split("|")]
    }
    assert list(rows) == [key.name for key in KEYS]
    for key in KEYS:
        if key.default is not None:
            assert rows[key.name] == f"no: `{key.default}`", key.name
        elif key.required:
            assert rows[key.name] == ("one VM" if key.vm_only else "yes"), key.name


def test_the_free_space_defaults_said_are_the_codes():
    """docs/training.md and `pipeline --help` give --need-gb's defaults for the 8B as the code works them out."""
    from tpu_grpo.catalog.models import DEFAULT_MODEL, MODELS
    from tpu_grpo.catalog.stores import default_need_text

    said = default_need_text(MODELS[DEFAULT_MODEL])
    assert said == "148.5,36.1 on shm, 20.1,148.5 on disk"
    assert f"for the 8B: {said.replace(' on shm', ' GB on shm')})" in " ".join(
        (ROOT / "docs/training.md").read_text().split()
    )
    shown = invoke("--help", "pipeline", cwd=ROOT).stdout
    assert said in " ".join(shown.split())
    on_disk = said.split(", ")[1].split(",")[1].removesuffix(" on disk")  # the data disk's, with the disk store
    assert f"(about {on_disk} GB with the defaults for the 8B model;" in " ".join(
        (ROOT / "docs/recovery.md").read_text().split()
    )


def test_the_readmes_task_listing_runs_as_printed():
    """`invoke --list` alone finds no invoke on a fresh machine (uv installs it in the project's environment)."""
    readme = (ROOT / "README.md").read_text()
    assert "`uv run invoke --list` shows every task" in readme and "`invoke --list`" not in readme
    assert invoke("--list", cwd=ROOT).returncode == 0


def test_a_flex_start_vm_is_said_to_run_uninterrupted_until_its_end():
    """Google's "About Flex-start VMs": they "run uninterrupted for up to seven days", then are stopped or deleted. The
    page that offers flex-start for work that must not be interrupted does not then say it may be taken back."""
    text = " ".join(documentation().split()).lower()
    assert not re.search(r"flex-start vms? (may|might|can) (also )?be (taken back|preempted)", text)
    assert "flex-start vms may also be taken back" not in text and "run uninterrupted for up to seven days" in text
    row = next(
        line for line in (ROOT / "docs/capacity.md").read_text().splitlines() if line.startswith("| `flex-start`")
    )
    assert "uninterrupted" in row and "preempted" not in row


#: How the labels' help names each resource type the program declares (infra/), labelled or not.
LABELLED_AS = {
    "gcp:compute/instance:Instance": "the VM",
    "gcp:compute/disk:Disk": "its data disk",
    "gcp:compute/snapshot:Snapshot": "a move's snapshot",
    "gcp:storage/bucket:Bucket": "the bucket",
    "gcp:container/cluster:Cluster": "a slice's cluster",
    "gcp:container/nodePool:NodePool": "its nodes",
    "gcp:artifactregistry/repository:Repository": "image repository",
    "gcp:compute/network:Network": "a network",
    "gcp:compute/subnetwork:Subnetwork": "a network",
    "gcp:compute/firewall:Firewall": "a firewall rule",
}


def test_the_labels_help_names_what_the_program_labels(stack_values, tmp_path):
    """`settings`, settings.md and the program agree on which resources take tpu-grpo:labels: each resource type the
    program declares is named in the help, on the side of those that take them or of those that take none."""
    from infra import offline
    from tpu_grpo.config.keys import KEY

    help_text = KEY["tpu-grpo:labels"].help
    taken, untaken = help_text.split(" (", 1)
    assert help_text in " ".join((ROOT / "docs/settings.md").read_text().split())
    vm = {
        **stack_values,
        "tpu-grpo:labels": {"team": "ml"},
        "tpu-grpo:checkpointStore": "gs://grpo-runs/runs",
        "tpu-grpo:bucket": "true",
        "tpu-grpo:fallback": [{"zone": "us-east5-a"}],
        "tpu-grpo:placed": {"zone": "us-east5-a", "capacity": "reservation", "movedFrom": "us-east5-b"},
    }
    slice_ = {
        **vm,
        "tpu-grpo:slice": "v6e-16",
        "tpu-grpo:usePathways": "true",
        "tpu-grpo:placed": None,
        "tpu-grpo:fallback": None,
    }
    seen: dict[str, bool] = {}
    for raw in (vm, slice_):
        _, resources, _ = offline.run({k: v for k, v in raw.items() if v is not None}, "dev")
        for resource in resources:
            if resource.type.startswith("gcp:") and "IAM" not in resource.type and "Iam" not in resource.type:
                inputs = json.dumps(resource.inputs)
                seen[resource.type] = seen.get(resource.type, False) or '"team": "ml"' in inputs
    assert "gcp:compute/snapshot:Snapshot" in seen and "gcp:container/nodePool:NodePool" in seen
    for kind, labelled in seen.items():
        assert LABELLED_AS[kind] in (taken if labelled else untaken), (kind, labelled)


def timeline_sample() -> tuple[list[str], list[str]]:
    """docs/capacity.md's sample of `invoke timeline`, and what timeline.show prints for its own rows (a VM of 8
    reservation chips, booted at its first row, now at its last)."""
    import calendar
    import io

    from rich.console import Console

    from tpu_grpo.results import timeline

    page = (ROOT / "docs/capacity.md").read_text()
    start = page.index("```\nwhere the hours of ")
    sample = page[start + 4 : page.index("```", start + 4)].rstrip("\n").splitlines()
    stamp = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)"
    rows = [re.search(rf"{stamp}\W+{stamp}\W+\d+m\d\ds\W+(.+?)\s*\W?$", line) for line in sample]

    def at(text: str) -> int:
        return calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S"))

    phases = [
        timeline.Phase("train" if "GRPO" in row[3] else "job", row[3], at(row[1]), at(row[2])) for row in rows if row
    ]
    host = re.search(r"where the hours of (\S+) went \(UTC\)", sample[0])[1]
    shown = timeline.Timeline(
        host, phases[0].start, max(phase.end for phase in phases), phases, chips=8, capacity="reservation"
    )
    console = Console(width=120, record=True, file=io.StringIO())
    timeline.show(console, shown, Path(".tpu-grpo/timeline.png"))
    return [line.rstrip() for line in sample], [line.rstrip() for line in console.export_text().splitlines()]


def test_the_timeline_sample_is_what_timeline_prints():
    """docs/capacity.md's sample of `invoke timeline` is what it prints for those rows, table and cost line included."""
    sample, printed = timeline_sample()
    assert sample == printed


def test_a_dry_run_said_to_print_json_is_one_of_a_task_that_takes_json():
    """slices.md said `--dry-run --json` of train, convert and export, which take no --json: each `TASK ... --dry-run
    --json` the pages name is a task with --json."""
    takes_json = _tasks_with("json_")
    said = {task for page in PAGES for task in re.findall(r"`(\w+) --dry-run --json`", page.read_text())}
    assert said and said <= takes_json, said - takes_json
    assert not re.search(r"(?<!\w )`--dry-run --json`", " ".join(page.read_text() for page in PAGES))


def test_where_the_vm_is_made_is_said_for_every_capacity_and_the_package_names_no_one_run():
    """`settings` explained gcp:project and gcp:zone by the reservation on a spot stack, and pyproject's description
    still said "Llama 3.1 8B on a reserved v6e-8"."""
    import tomllib

    from tpu_grpo.config.keys import KEY

    for name in ("gcp:project", "gcp:zone"):
        assert KEY[name].help.startswith(("Google Cloud project the VM or slice", "zone of the VM or the slice's"))
        assert "(with capacity reservation: " in KEY[name].help  # the reservation's only with that capacity
    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    assert "Cloud TPU v6e" in description and "Llama" not in description and "v6e-8" not in description

"""How the suite runs in parallel (pytest-xdist, `--dist loadgroup`; scripts/test runs it so), in one place.

scripts/test runs the suite in two passes: every test not marked `serial` on several workers (`-n 3 --dist loadgroup
--skip-serial`: most integration and end-to-end tests wait on real agents, brokers and rollouts, not on the CPU),
then the tests marked `serial` alone (`--only-serial`). A test is `serial` when the figure it asserts is a promise
about a quiet machine (an idle agent's CPU share, a byte rate held within 10 %, a wall-time budget against a load the
test makes itself, a language model's token latency judged before and after on the same cores) and another test
beside it would change the figure, not the behaviour. A benchmark run as a test that asserts no figure
(bench/fleet.py) is CPU-bound, not serial.

In the parallel pass the scheduler groups the tests by their path (`xdist_group` below), so that:
- the CPU-bound tests (conversions, the recipe search, the runtimes' own builders) run one after another on one
  worker (group `cpu-heavy`): two of them at once on 2 cores only slow each other and squeeze their time budgets;
- the pages that run as written (docs/getting-started.md, docs/language-models.md) use the ports the page names,
  so they never run at the same time (group `fixed-ports`);
- the other integration and end-to-end tests stay together by module (their module-scoped fixtures, a converted
  bundle or a started fleet, are made once, on the worker that runs the module);
- unit tests get no group and spread over the workers test by test.

Every worker has its own session fixtures (a Mosquitto, a PostgreSQL server, EDGEFLEET_HOME) in its own base
temporary directory, and servers take free ports. What is costly to make and only read afterwards is made once per
run (support/run_once.py): the session's keys (each worker copies them into its own EDGEFLEET_HOME), the demo
bundles and the tinylm bundles; four workers converting tinylm at once on 2 cores took minutes each and timed every
candidate against the others.
"""

from __future__ import annotations

import pytest

CPU_HEAVY = (
    "integration/converter/",
    "integration/targets/",
    "integration/agent/test_benchmark_farm.py",  # devices time every candidate (a benchmark farm, 132 s)
    "integration/agent/runtime/test_generative_runtime.py",  # its module fixture converts tinylm for OpenVINO GenAI
    "integration/packaging/test_demo_wheel.py",  # pip installs the host extra into a fresh venv, then the demo
)
# Not in the group, though CPU-bound in part: this group is the parallel pass's longest queue (2,817 s of the pass's
# 2,862 s in a full run here, the other two workers idle for its last 13 minutes), so what times nothing against a
# budget runs beside it:
# - integration/control/test_control_bench.py: bench/fleet.py's simulated fleets, which assert that nothing is lost;
# - e2e/test_rollout_corpus_agents.py: its rollouts judge another model against builds timed beside other work,
#   widened by those builds' own spread (judge/latency.py); the four conversions it ships are made once per run
#   (support/rollouts/corpus.py `families_on_defaults`), by it or by test_converter_corpus.py, whichever asks first.
FIXED_PORTS = ("e2e/test_getting_started.py", "e2e/test_language_models_page.py")  # 8883, 8780, 8471, 8472


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("edgefleet")
    group.addoption("--skip-serial", action="store_true", help="leave out the tests marked serial (parallel pass)")
    group.addoption("--only-serial", action="store_true", help="run only the tests marked serial (quiet pass)")


def xdist_group(relative: str) -> str | None:
    """The group of a test file (its path under tests/), or None for one that may run beside anything."""
    if relative.startswith(CPU_HEAVY):
        return "cpu-heavy"
    if relative in FIXED_PORTS:
        return "fixed-ports"
    if relative.startswith(("integration/", "e2e/")):
        return relative
    return None


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_GroupsByPath(), "edgefleet-xdist-groups")


class _GroupsByPath:
    """`--dist loadgroup` with the groups above, read from each test's path on the controller.

    xdist 3.8 puts a test's `xdist_group` mark into its node id, which pytest 9 no longer lets a plugin change: the
    marks reach no scheduler and loadgroup runs test by test. Here the scheduler itself groups (a node id that does
    carry `@group`, from an xdist that works again, keeps that group)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: object) -> object | None:
        if config.getvalue("dist") != "loadgroup":
            return None
        from xdist.scheduler import LoadGroupScheduling

        class PathGroupScheduling(LoadGroupScheduling):
            ordered = False

            def _split_scope(self, nodeid: str) -> str:
                if nodeid.rfind("@") > nodeid.rfind("]"):
                    return super()._split_scope(nodeid)
                group = xdist_group(nodeid.split("::")[0].removeprefix("tests/"))
                return nodeid if group is None else f"group:{group}"

            def _assign_work_unit(self, node: object) -> None:
                # The longest units first, so that none starts last: xdist orders them by test count, which put the
                # two pages (4 tests, a quarter of an hour) at the end of the queue.
                if not self.ordered:
                    self.ordered = True
                    units = sorted(self.workqueue.items(), key=lambda unit: (_rank(unit[0]), -len(unit[1])))
                    self.workqueue.clear()
                    self.workqueue.update(units)
                super()._assign_work_unit(node)  # type: ignore[arg-type]

        return PathGroupScheduling(config, log)  # type: ignore[arg-type]


def _rank(scope: str) -> int:
    """Where a unit of work goes in the queue: the CPU-bound group, the pages, end-to-end, integration, unit tests."""
    for rank, prefix in enumerate(("group:cpu-heavy", "group:fixed-ports", "group:e2e/", "group:integration/")):
        if scope.startswith(prefix):
            return rank
    return 4


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_serial, only_serial = config.getoption("--skip-serial"), config.getoption("--only-serial")
    if skip_serial and only_serial:
        raise pytest.UsageError("--skip-serial and --only-serial leave nothing to run; pass one")
    if not (skip_serial or only_serial):
        return
    kept, dropped = [], []
    for item in items:
        (kept if (item.get_closest_marker("serial") is not None) == only_serial else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept

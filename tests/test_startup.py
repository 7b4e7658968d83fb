"""The command line's start-up (nlptrain/startup.py): the libraries are imported without a full
collection of the cyclic collector, what they made is frozen, and the collector is on again
for the run; a Python caller's collector is left as it was."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO, child_env

PROBE = """
import gc, json, sys
{before}
full_before = gc.get_stats()[2]["collections"]
from nlptrain.startup import LIBRARIES, import_libraries
import_libraries()
frozen = gc.get_freeze_count()
import_libraries()  # once a process
print(json.dumps({{"full_collections": gc.get_stats()[2]["collections"] - full_before,
                  "frozen": frozen, "frozen_again": gc.get_freeze_count(),
                  "enabled": gc.isenabled(),
                  "imported": all(name in sys.modules for name in LIBRARIES)}}))
"""


def probe(before: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE.format(before=before)], env=child_env(),
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_the_libraries_are_imported_without_a_full_collection_and_frozen():
    found = probe()
    assert found["imported"]
    # Its own, before the imports (cheap then); with the collector on, six more here.
    assert found["full_collections"] == 1
    assert found["frozen"] > 100_000  # torch and transformers' objects, out of its sight
    assert found["frozen_again"] == found["frozen"]
    assert found["enabled"]


def test_a_caller_that_turned_the_collector_off_keeps_it_off():
    found = probe(before="gc.disable()")
    assert found["imported"] and found["frozen"] > 100_000
    assert not found["enabled"]


def test_the_train_command_trains_with_the_startup_objects_frozen(toy_task, tmp_path):
    state = tmp_path / "collector.json"
    scaffold = f"{REPO / 'tests' / 'scaffold_callbacks.py'}:CollectorState"
    done = subprocess.run([sys.executable, "-m", "nlptrain", "train", "--task", str(toy_task),
                           "--max-steps", "1", "--output-dir", str(tmp_path / "run"),
                           "--callback", scaffold],
                          env={**child_env(), "COLLECTOR_STATE": str(state)},
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(state.read_text())
    assert found["enabled"]
    assert found["frozen"] > 100_000

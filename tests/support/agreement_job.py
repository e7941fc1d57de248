"""One process of a two-process run that drives :class:`hydrax.run.hosts.HostAgreement` by hand.

Run as ``python tests/support/agreement_job.py PROCESS_ID PORT SCENARIO`` for process 0 and 1;
prints one JSON line: what each ``wait_for`` did. Used by ``tests/test_hosts.py``.

Scenarios: ``agree`` (both load batches 0-3; every wait returns), ``fail`` (process 1 fails
batch 2; process 0 loads it and must stop there), ``forms`` (process 1 hands batch 1 out cached,
process 0 loaded it: they disagree), ``silent`` (process 1 never loads batch 1: process 0 times out).
"""

import json
import sys

import jax

process_id, port, scenario = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60)

from hydrax.run.hosts import HostAgreement, distributed_client, jax_process_split  # noqa: E402

split = jax_process_split()
agreement = HostAgreement(distributed_client(), process_id, 2, compare_forms=scenario == "forms")
agreement.start()
results = []
try:
    for seq in range(4):
        if scenario == "fail" and process_id == 1 and seq == 2:
            agreement.fail(2, "batch 2 (epoch 0)", "ValueError: broken item")
            break
        if not (scenario == "silent" and process_id == 1 and seq >= 1):
            agreement.loaded(seq + 1, cached=scenario == "forms" and process_id == 1 and seq == 1)
        try:
            # only the silent scenario is meant to time out: elsewhere, room for a busy machine
            agreement.wait_for(seq, lambda seq=seq: f"batch {seq} (epoch 0)", timeout=3 if scenario == "silent" and seq >= 1 else 60)
            results.append("ok")
        except Exception as exc:
            results.append(f"{type(exc).__name__}: {exc} [{getattr(exc, 'process_index', None)}, {getattr(exc, 'batch', None)}]")
            break
    if scenario == "silent":
        # Process 1 stays alive, quietly, until process 0 has timed out: however slow the machine,
        # process 0 must meet a live peer that is silent, not one that has gone.
        if process_id == 0:
            distributed_client().key_value_set("silent-test-done", "1")
        else:
            distributed_client().blocking_key_value_get("silent-test-done", 600_000)
finally:
    agreement.stop()
print(json.dumps({"split": split, "results": results}), flush=True)

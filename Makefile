# make test / make demo work on a fresh machine: they install what they need.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
APT_PACKAGES := kcat redis-server openjdk-17-jre-headless openjdk-17-jdk-headless maven iproute2 openssl prometheus \
                chromium chromium-driver npm

.PHONY: test demo bench soak lint sysdeps venv clean peers console-assets

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py cluster/protocol/_speedups.c cluster/protocol/varint.h spark_aggregate/_columns.c \
          spark_aggregate/_avro.c
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# Debian packages the tests (and the demo's Spark load: Java) use; skipped when already present.
# prometheus: its promtool and server check the monitoring files `deploy render` writes.
# chromium, chromium-driver: the console's tests drive Debian's Chromium headless through its
# chromedriver (tests/console/browser.py); npm installs their front-end packages (console-assets).
sysdeps:
	@missing=""; \
	command -v kcat >/dev/null 2>&1 || missing="$$missing kcat"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	command -v javac >/dev/null 2>&1 || missing="$$missing openjdk-17-jdk-headless"; \
	command -v mvn >/dev/null 2>&1 || missing="$$missing maven"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v openssl >/dev/null 2>&1 || missing="$$missing openssl"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	bare=""; command -v promtool >/dev/null 2>&1 || bare="prometheus"; \
	if [ -n "$$missing$$bare" ]; then \
	  echo "installing Debian packages:$$missing $$bare"; \
	  apt-get update -qq && \
	  { [ -z "$$missing" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; } && \
	  { [ -z "$$bare" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$bare >/dev/null; }; \
	fi

# Apache Kafka 4.x (broker, tools, MirrorMaker 2, Streams) and Spark's Kafka source, pinned in
# tests/peers/peers.toml, from Maven Central into ~/.cache/dcmirror/peers ($$DCMIRROR_PEERS_DIR);
# a warm cache fetches nothing.
peers: venv sysdeps
	$(PY) -m tests.peers.fetch

# The npm packages the console's browser tests use (axe-core), pinned by
# tests/console/package-lock.json, installed with `npm ci` into ~/.cache/dcmirror/npm
# ($$DCMIRROR_NPM_DIR), never into the repository; tests/console/browser.py reads them there.
# A warm cache (its .installed holds the package.json and lock it was installed from) does nothing.
DCMIRROR_NPM_DIR ?= $(HOME)/.cache/dcmirror/npm
console-assets: sysdeps
	@dir="$(DCMIRROR_NPM_DIR)"; \
	if cat tests/console/package.json tests/console/package-lock.json | cmp -s - "$$dir/.installed" \
	   && [ -f "$$dir/node_modules/axe-core/axe.min.js" ]; then exit 0; fi; \
	echo "installing the console tests' npm packages into $$dir"; \
	mkdir -p "$$dir" && rm -f "$$dir/.installed" && \
	cp tests/console/package.json tests/console/package-lock.json "$$dir"/ && \
	(cd "$$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) && \
	cat tests/console/package.json tests/console/package-lock.json > "$$dir/.installed"

# Test runs keep compiled bytecode, pytest's rewritten test modules too, under .venv/pycache
# even where PYTHONDONTWRITEBYTECODE is set (CI sets it: its clone ends without a __pycache__):
# else every broker, mirror worker and CLI process a test starts compiles what it imports
# again (~0.6 CPU-s a broker) and each xdist worker rewrites every test module (~11 CPU-s).
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache

test: venv sysdeps peers console-assets
	$(VENV)/bin/ruff check cluster mirror topology spark_aggregate deploy tests
	$(VENV)/bin/mypy
	$(TEST_ENV) $(PY) -m pytest -m "not perf and not spark_session and not soak" -q --tb=short --durations=40 -n 2 --dist loadfile --no-loadscope-reorder
	$(TEST_ENV) $(PY) -m pytest -m "spark_session and not perf and not soak" -q --tb=short --durations=10

demo: venv sysdeps
	$(VENV)/bin/dcmirror demo

bench: venv sysdeps peers
	$(TEST_ENV) $(PY) -m pytest -m perf -q -s tests/perf

# The tests whose fault schedules come from tests/fault_workload.fault_rng: a fixed seed each
# in make test, new ones in make soak (tests/unit/test_fault_seeds.py keeps this list whole).
FAULT_SCHEDULES := \
	tests/fault/test_replication_faults.py::test_hard_bounce_of_a_leader_five_times \
	tests/fault/test_replication_faults.py::test_clean_bounce_of_a_leader_five_times \
	tests/fault/test_replication_faults.py::test_controller_and_a_leader_killed_together \
	tests/fault/test_transactions_faults.py::test_consume_transform_produce_exactly_once_through_kills \
	tests/fault/test_client_idempotence.py::test_idempotent_producer_writes_each_record_once_across_leader_kill9 \
	tests/fault/test_client_idempotence.py::test_consumer_group_reads_everything_across_leader_kill9 \
	tests/interop/test_consumer_groups_kip848.py::test_kip848_group_survives_member_and_coordinator_kill9 \
	tests/kafka/test_java_clients.py::test_kafka_streams_exactly_once_v2_through_broker_kills \
	tests/mirror/test_mirror_topics_faults.py::test_mirror_topics_byte_for_byte_through_leader_kills_retention_and_compaction \
	tests/mirror/test_exactly_once.py::test_two_sources_mirrored_exactly_once_through_worker_and_leader_kill9 \
	tests/mirror/test_transactions.py::test_aborted_source_transactions_never_reach_the_aggregate \
	tests/mirror/test_dr_faults.py::test_dr_datacenter_faults_lose_no_acknowledged_record \
	tests/interop/test_groups.py::test_member_killed_partitions_move_to_survivors \
	tests/fault/test_share_state_faults.py::test_a_share_partition_leader_killed_9_loses_no_acknowledgement_and_no_record \
	tests/fault/test_share_group_faults.py::test_share_group_delivery_guarantees_under_seeded_kill_9

# The replication simulation, every seed below 944 (make test runs a fixed 270 of them) and many
# more, longer (DCMIRROR_SOAK_SEEDS); the mirror simulation's new seeds, 3x longer
# (DCMIRROR_MIRROR_SOAK_SEEDS; make test runs seeds 0..999); the example failover test the
# simulation and tests/mirror/test_dr_faults.py now cover; loads killed at every step under new
# seeds, each printed (DCMIRROR_SOAK_CRASH_RUNS runs); the fault schedules above under new
# seeds, each printed (replay: DCMIRROR_FAULT_SEED=<seed> pytest <the test>); the share
# partition's model check over 20,000 new seeds (a failure names its seed).
soak: venv sysdeps peers
	$(TEST_ENV) $(PY) -m pytest -m soak -q -s tests/unit/test_replication_sim.py tests/unit/test_mirror_sim.py \
	    tests/mirror/test_failover.py tests/spark/test_load_crash.py
	$(TEST_ENV) DCMIRROR_FAULT_NEW_SEEDS=1 $(PY) -m pytest -q -s $(FAULT_SCHEDULES)
	$(TEST_ENV) DCMIRROR_FUZZ_EXPLORE=1 $(PY) -m pytest -q tests/unit/test_protocol_fuzz.py tests/interop/test_fuzz_broker.py
	$(TEST_ENV) DCMIRROR_SHARE_SEEDS=20000 DCMIRROR_SHARE_SEED_BASE=$$(date +%s) $(PY) -m pytest -q \
	    tests/unit/test_share_partition.py -k seeded

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache

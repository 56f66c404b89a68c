"""Demonstrations and validation as Ray tasks on a local two-node cluster (--address)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Ray runs in the test's child process only: importing it when collected cost each worker ~0.4 CPU s
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="could not import 'ray'")

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
cluster.add_node(num_cpus=1)
cluster.wait_for_nodes()
import ray
from looprl.ir.problem import matmul
from looprl.measurement.evaluator import Evaluator
from looprl.train import cluster as on_cluster
from looprl.train.demonstrations import expert_demonstrations
from looprl.train.validation import Validator
from tests.policies import random_policy

agent = {"algorithm": "dqn", "env": {"problems": ["32x32x32"], "cache": ":memory:", "split_factors": [4, 8, 16], "episode_length": 10}}
problems = [matmul(m=m, n=32, k=24) for m in (16, 24, 32, 40, 48, 56, 64, 72)]
policy = random_policy(seed=1)
demos, summary = expert_demonstrations(agent, problems, policy, 0.05, log=lambda *_: None, address=cluster.address)
episodes = on_cluster.rollouts_on_cluster(policy, [p.name for p in problems], ":memory:", 0.001, None, 1, per_task=1)
score = Validator(problems, Evaluator(":memory:", 0.001), address=cluster.address, node_cache=":memory:")(policy)
print(json.dumps({"demos": [d.problem.name for d in demos], "summary": summary, "nodes": len({e["node"] for e in episodes}),
                  "episodes": [e["problem"] for e in episodes], "score": score}))
ray.shutdown()
cluster.shutdown()
'''


def test_demonstrations_and_validation_run_as_tasks_on_both_nodes_of_a_local_cluster():
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled")
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    names = [f"mk,kn->mn:m={m},k=24,n=32" for m in (16, 24, 32, 40, 48, 56, 64, 72)]
    assert result["demos"] == names and result["episodes"] == names  # every problem, in order
    assert result["summary"]["problems"] == 8 and sum(result["summary"]["measured_on"].values()) == 8
    assert result["nodes"] == 2  # spread over both nodes
    assert result["score"] > 0  # a geometric mean of the episodes' speed-ups, measured on the nodes

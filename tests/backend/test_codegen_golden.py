"""Generated IR pinned for a handful of schedules: any change to the text the code generator
emits for them fails here. When a change is intended (and the measurement cache's
``CODEGEN_VERSION`` bumped if speed may change), update the hashes below."""

import hashlib

import pytest

from looprl.backend.codegen import generate_ir
from looprl.ir.nest import LoopNest
from looprl.ir.problem import parse_problem
from looprl.target import Target

# (what it covers, target, problem, schedule key, first 16 hex digits of the IR's SHA-256)
GOLDEN = [
    ("untiled", "avx512", "mk,kn->mn:m=64,k=64,n=64", "m64s1,k64s1,n64s1|m64s1,n64s1", "a35a986a94a22cfa"),
    ("masked tails, tail functions", "avx2", "mk,kn->mn:m=37,k=29,n=53", "m4s8t5,m8s1,k29s1,n53s1|m37s1,n53s1", "7ad9c78698a5b6b8"),
    ("register blocks", "avx2", "mk,kn->mn:m=32,k=48,n=43", "n1s40t3,m5s6t2,k48s1,m6s1,n40s1|m32s1,n43s1", "3768fe6f9c46dd7f"),
    ("parallel loop", "avx2", "mk,kn->mn:m=64,k=64,n=64", "m2s32p,m16s2,m2s1,k64s1,n64s1|m64s1,n64s1", "67ca744cc66532b8"),
    ("no FMA, bias + relu, parallel", "sse4", "mk,kn->mn:m=96,k=48,n=130;epilogue=bias+relu", "m6s16p,m8s2,m2s1,k48s1,n130s1|m96s1,n130s1",
     "5c8a5e8a1f431f81"),
    ("scale + bias + gelu + residual", "avx512", "mk,kn->mn:m=20,k=33,n=45;const=in1;epilogue=scale0.5+bias+gelu+residual",
     "m1s12t8p,m6s2,m2s1,k33s1,n45s1|m20s1,n45s1", "53c7a8f53b515f8e"),
    ("batched, silu", "avx2", "bmk,bkn->bmn:b=3,m=17,k=24,n=40;epilogue=silu", "b1s3,b3s1,m17s1,k24s1,n40s1|b3s1,m17s1,n40s1", "ea08c22861045c7c"),
    ("matrix-vector, dot products", "sse4", "mk,k->m:m=70,k=90", "m23s3t1,m3s1,k90s1|m70s1", "b7dfd190272f4d72"),
    ("linear layer in place, dot products, bias", "avx2", "mk,nk->mn:m=3,n=21,k=37;const=in1;epilogue=bias",
     "n2s8t5,m3s1,k4s8t5,n8s1,k8s1|m3s1,n21s1", "fedcdea6a8ca5693"),
    ("packed inputs, bound entries", "avx512", "mk,kn->mn:m=64,k=64,n=64",
     "m2s24t16,m24s1,k1s48t16,k3s16,k16s1,n64s1|m64s1,n64s1|in0=k16.m1.k1%16;in1=k16.n1.k1%16", "5d20002b2d99dc7d"),
    ("parallel loop, packed input", "avx512", "mk,kn->mn:m=64,k=64,n=64", "m1s54t10p,m3s18,m6s3,m3s1,k64s1,n64s1|m64s1,n64s1|in0=m54.k1.m1%54",
     "2245ffe10089ded4"),
]


@pytest.mark.parametrize(("what", "target", "problem", "key", "digest"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_generated_ir_is_unchanged(what, target, problem, key, digest):
    nest = LoopNest.from_key(parse_problem(problem), key)
    assert nest.key == key
    ir = generate_ir(nest, Target.named(target))
    assert hashlib.sha256(ir.encode()).hexdigest()[:16] == digest, f"the IR of {what!r} changed"

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`umbp size`: block, slot and pool sizes from a model's config.json, against
values computed by hand below (the arithmetic is written out, so a change of
formula in tools/cmd_size.c fails here), and the errors for bad input."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402

TOOL = os.environ["UMBP_TOOL"]
TMP = tempfile.mkdtemp(prefix="umbp-size-")
POOL = f"t-size-{os.getpid()}"

# Shaped as the real files on the Hugging Face hub (fields umbp size does not
# read are kept, so that they are seen to be ignored).
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
             "num_key_value_heads": 8, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "vocab_size": 128256}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "num_attention_heads": 128, "num_hidden_layers": 61, "num_key_value_heads": 128,
               "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
               "v_head_dim": 128, "torch_dtype": "bfloat16", "vocab_size": 129280}

GiB = 1 << 30


def write(name, obj):
    p = os.path.join(TMP, name)
    with open(p, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def umbp(*args):
    r = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def size_json(cfg, *args):
    rc, out, err = umbp("size", "--model-config", cfg, "--json", *args)
    assert rc == 0, (rc, out, err)
    return json.loads(out)


LL = write("llama.json", LLAMA3_8B)
DS = write("deepseek.json", DEEPSEEK_V3)
checks, check = taplib.registry()


@check("Llama-3-8B, tp 1, bf16, 16-token blocks: 2 MiB per block")
def _():
    d = size_json(LL)
    # head_dim = hidden_size / num_attention_heads = 4096 / 32 = 128
    # 32 layers x 2 (K,V) x 16 tokens x 8 KV heads x 128 x 2 bytes = 2,097,152 = 2 MiB
    assert 32 * 2 * 16 * 8 * 128 * 2 == 2097152
    assert d["head_dim"] == 128 and d["heads_per_rank"] == 8 and d["dtype_bytes"] == 2
    assert d["block_bytes_per_rank"] == 2097152 and d["slot_size"] == 2097152
    assert d["blocks_per_gib"] == GiB // 2097152 == 512
    # bytes per token over all ranks: 2 MiB x 1 rank / 16 tokens = 131072 (128 KiB, replay --help's figure)
    assert d["bytes_per_token_all_ranks"] == 131072
    # 1,000,000 tokens: ceil(1e6 / 16) = 62,500 blocks x 2 MiB x 1 rank = 131,072,000,000 bytes;
    # rounded up to whole GiB: 131072000000 / 2^30 = 122.07 -> 123 GiB
    assert d["capacity_bytes"] == 62500 * 2097152 == 131072000000
    assert d["capacity_rounded_bytes"] == 123 * GiB
    assert d["kv_connector_extra_config"] == {"slot_size": "2MiB", "capacity_bytes": "123GiB"}


@check("a config.json whose architecture holds a terminal escape: the table shows '?' for it, JSON keeps it")
def _():
    cfg = write("escape.json", dict(LLAMA3_8B, architectures=["Evil\u001b[2J\u001b]0;owned\u0007Model"]))
    rc, out, err = umbp("size", "--model-config", cfg)
    assert rc == 0, (rc, err)
    assert "\x1b" not in out and "\x07" not in out, repr(out[:300])
    assert "Evil?[2J?]0;owned?Model" in out, out[:300]
    assert size_json(cfg)["model"] == "Evil\x1b[2J\x1b]0;owned\x07Model"


@check("Llama-3-8B, tp 8: one KV head per rank, 256 KiB; tp 16 replicates the heads")
def _():
    d = size_json(LL, "--tp", "8")
    # 8 KV heads / 8 ranks = 1 head per rank: 32 x 2 x 16 x 1 x 128 x 2 = 262,144 = 256 KiB
    assert d["heads_per_rank"] == 1 and d["block_bytes_per_rank"] == 262144 and d["slot_size"] == 262144
    assert d["blocks_per_gib"] == 4096
    # all ranks per token: 262144 x 8 / 16 = 131072 (the model's 128 KiB per token is split, not grown)
    assert d["bytes_per_token_all_ranks"] == 131072
    # tp 16 > 8 KV heads: max(1, 8 // 16) = 1 head per rank, each head on 2 ranks
    d = size_json(LL, "--tp", "16")
    assert d["heads_per_rank"] == 1 and d["block_bytes_per_rank"] == 262144
    # 262144 x 16 / 16 = 262144 bytes per token over all ranks (twice the model's: replicated)
    assert d["bytes_per_token_all_ranks"] == 262144


@check("Llama-3-8B, fp8 KV, 32-token blocks, 100,000 tokens at tp 2")
def _():
    d = size_json(LL, "--tp", "2", "--kv-dtype", "fp8", "--block-size", "32", "--tokens", "100000")
    # 32 layers x 2 x 32 tokens x 4 heads x 128 x 1 byte = 1,048,576 = 1 MiB
    assert d["block_bytes_per_rank"] == 32 * 2 * 32 * 4 * 128 * 1 == 1048576
    # ceil(100000 / 32) = 3125 blocks x 1 MiB x 2 ranks = 6,553,600,000 bytes -> 7 GiB (6.10 rounded up)
    assert d["capacity_bytes"] == 3125 * 1048576 * 2 == 6553600000
    assert d["capacity_rounded_bytes"] == 7 * GiB


@check("DeepSeek-V3 (MLA): one 576-wide latent per token per layer, the same on every rank")
def _():
    for tp in ("1", "8"):
        d = size_json(DS, "--tp", tp)
        assert d["mla"] is True
        # 61 layers x 16 tokens x (512 + 64) x 2 bytes = 1,124,352 bytes, whatever the tp
        assert d["block_bytes_per_rank"] == 61 * 16 * (512 + 64) * 2 == 1124352
        # rounded up to 4 KiB: 1124352 / 4096 = 274.5 -> 275 x 4096 = 1,126,400 (1100 KiB)
        assert d["slot_size"] == 275 * 4096 == 1126400
        assert d["kv_connector_extra_config"]["slot_size"] == "1100KiB"
        # 2^30 / 1126400 = 953.2 -> 953 whole slots per GiB
        assert d["blocks_per_gib"] == 953
    # tp 8: 1124352 x 8 / 16 = 562,176 bytes per token over all ranks
    assert d["bytes_per_token_all_ranks"] == 562176
    # 1e6 tokens: 62,500 blocks x 1,126,400 x 8 ranks = 563,200,000,000 bytes -> 525 GiB (524.5 rounded up)
    assert d["capacity_bytes"] == 62500 * 1126400 * 8 == 563200000000
    assert d["capacity_rounded_bytes"] == 525 * GiB


@check("head_dim from the config wins over hidden_size / heads; no num_key_value_heads means MHA")
def _():
    p = write("hd.json", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 100, "head_dim": 64})
    d = size_json(p, "--block-size", "8", "--kv-dtype", "float32")
    # 2 layers x 2 x 8 tokens x 4 heads (= attention heads) x 64 x 4 bytes = 32,768
    assert d["kv_heads"] == 4 and d["head_dim"] == 64 and d["block_bytes_per_rank"] == 32768


@check("multimodal config: the shape is read from text_config")
def _():
    p = write("mm.json", {"architectures": ["Mistral3ForConditionalGeneration"], "torch_dtype": "bfloat16",
                          "text_config": {"num_hidden_layers": 40, "num_attention_heads": 32,
                                          "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120}})
    d = size_json(p)
    # 40 x 2 x 16 x 8 x 128 x 2 = 2,621,440 (2.5 MiB)
    assert d["block_bytes_per_rank"] == 2621440


@check("text output: the replay flags, the pool command and the connector keys")
def _():
    rc, out, err = umbp("size", "--model-config", LL, "--tp", "8")
    assert rc == 0, err
    assert "umbp replay TRACE.jsonl --block-tokens 16 --bytes-per-token 131072 --tp 8" in out, out
    assert "--slot-size 256KiB" in out and "\"slot_size\":\"256KiB\"" in out, out
    assert "262144 bytes per rank" in out, out


@check("the replay line is one umbp replay takes: none beyond its 32 ranks, with the reason")
def _():
    # DeepSeek-V3's 128 attention heads split over 64 ranks (Llama-3-8B's 32 would not)
    rc, out, err = umbp("size", "--model-config", DS, "--tp", "64")
    assert rc == 0, err
    assert "umbp replay TRACE" not in out and "replay       none: umbp replay runs 1 to 32 ranks" in out, out
    rc, out, err = umbp("size", "--model-config", LL, "--tp", "32")
    line = next(l for l in out.splitlines() if l.startswith("replay "))
    cmd = line.split(None, 1)[1].split(" (")[0].replace("TRACE.jsonl", "--generate chat")
    # replay accepts it: its options are checked before --output writes the (one-conversation) workload
    p = subprocess.run([TOOL, *cmd.split()[1:], "--conversations", "1", "--output", os.devnull],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (cmd, p.stderr)
    # a shard over replay's 1 GiB (16384-token blocks: 2 GiB at tp 1)
    rc, out, err = umbp("size", "--model-config", LL, "--block-size", "16384")
    assert rc == 0 and "replay       none:" in out and "over the 1 GiB" in out, (rc, out, err)
    # MLA is the same on every rank: any tp vLLM takes (one that divides the 128 attention heads)
    assert size_json(DS, "--tp", "4")["block_bytes_per_rank"] == 1124352


@check("a full stdout: exit 1 naming the failed write, never a silent success")
def _():
    for args in (["--json"], []):
        with open("/dev/full", "w") as full:
            p = subprocess.run([TOOL, "size", "--model-config", LL, *args], stdout=full, stderr=subprocess.PIPE,
                               text=True, timeout=60)
        assert p.returncode == 1 and "writing the output failed: No space left" in p.stderr, (args, p.stderr)


@check("bad input: exit 1 for an unreadable file, 2 for usage, each message naming the cause")
def _():
    cases = [
        (["--model-config", os.path.join(TMP, "nope.json")], 1, "cannot read --model-config"),
        (["--model-config", write("notjson.json", "{\"num_hidden_layers\": ")], 1, "is not JSON"),
        (["--model-config", write("arr.json", "[1, 2]")], 1, "not an object"),
        (["--model-config", write("nolayers.json", {"hidden_size": 4096})], 2, "no 'num_hidden_layers'"),
        (["--model-config", write("noheads.json", {"num_hidden_layers": 2})], 2, "no 'num_attention_heads'"),
        (["--model-config", write("nohd.json", {"num_hidden_layers": 2, "num_attention_heads": 4})], 2,
         "no 'hidden_size' nor 'head_dim'"),
        (["--model-config", write("strlayers.json", {"num_hidden_layers": "32"})], 2,
         "'num_hidden_layers' is not a positive integer"),
        (["--model-config", LL, "--tp", "0"], 2, "--tp '0'"),
        (["--model-config", LL, "--tp", "+2"], 2, "--tp '+2'"),  # digits only: strtoll takes a sign
        (["--model-config", LL, "--tp", " 2"], 2, "--tp ' 2'"),
        (["--model-config", LL, "--block-size", "x"], 2, "--block-size 'x'"),
        (["--model-config", LL, "--kv-dtype", "int4"], 2, "--kv-dtype 'int4'"),
        (["--tp", "8"], 2, "--model-config FILE is required"),
        # an empty name is a usage error, not "cannot read --model-config : No such file" (exit 1)
        (["--model-config", ""], 2, "--model-config needs a file name"),
        (["--model-config", LL, "--pool", "bad/name"], 2, "--pool"),
        (["--model-config", LL, "--pool", "no-such-pool-size-xyz"], 1, "cannot read pool 'no-such-pool-size-xyz'"),
        # a directory, a device, a huge file: named as such, not "not JSON ... near end of file"
        (["--model-config", TMP], 1, f"--model-config {TMP} is a directory"),
        (["--model-config", "/dev/zero"], 1, "is a character device"),
        (["--model-config", write("huge.json", "[" * ((16 << 20) + 1))], 1, "is over 16 MiB"),
        # vLLM needs kv_heads % tp == 0 or tp % kv_heads == 0 (8 KV heads: 3 gave a truncated "2 per rank")
        (["--model-config", LL, "--tp", "3"], 2, "--tp 3 does not divide the model's 8 KV heads"),
        (["--model-config", LL, "--tp", "12"], 2, "--tp 12 does not divide the model's 8 KV heads"),
        # vLLM also needs num_attention_heads % tp == 0, MLA models included: 32 % 64 and 128 % 3 are refused
        # there ("Total number of attention heads (32) must be divisible by tensor parallel size (64)")
        (["--model-config", LL, "--tp", "64"], 2, "--tp 64 does not divide the model's 32 attention heads"),
        (["--model-config", DS, "--tp", "3"], 2, "--tp 3 does not divide the model's 128 attention heads"),
    ]
    for args, want, words in cases:
        rc, out, err = umbp("size", *args)
        assert rc == want and words in err, (args, rc, err)


@check("--pool: fits the slots of an existing pool, or not (exit 1 with the slot size to create)")
def _():
    rc, out, err = umbp("pool", "create", POOL, "--capacity", "4MiB", "--slot-size", "256KiB", "--no-prefault",
                        "--quiet")
    assert rc == 0, err
    d = size_json(LL, "--tp", "8", "--pool", POOL)
    assert d["pool"] == {"name": POOL, "slot_size": 262144, "slot_count": 16, "fits": True}, d
    rc, out, err = umbp("size", "--model-config", LL, "--tp", "4", "--pool", POOL)
    # tp 4: 2 heads per rank, 512 KiB > 256 KiB slots
    assert rc == 1 and "DOES NOT FIT" in out and "--slot-size 512KiB" in err, (rc, out, err)


@check("the 'umbp pool create' line works: at least 2 slots, at most 16,777,215, no overflow")
def _():
    # --block-size 16384 at tp 1: a 2 GiB block; 1 token is 1 block, but a pool needs 2 slots
    d = size_json(LL, "--block-size", "16384", "--tokens", "1")
    assert d["slot_size"] == 2 * GiB and d["capacity_rounded_bytes"] == 4 * GiB, d
    # 268,435,440 tokens / 16 = 16,777,215 blocks of 2 MiB: the most one pool holds, whole
    d = size_json(LL, "--tokens", "268435440")
    assert d["capacity_rounded_bytes"] // d["slot_size"] == 16777215, d
    rc, out, err = umbp("size", "--model-config", LL, "--tokens", "268435441")
    assert rc == 2 and "16777216 slots" in err and "at most 268435440" in err and not out, (rc, out, err)
    # 2^40 tokens x 16 KiB x 4096 ranks is 2^66 bytes: it used to wrap to "--capacity 0" (Llama-3-8B's
    # shape with 4096 attention heads, so that vLLM would take tp 4096: 32 x 2 x 1 x 1 x 128 x 2 = 16 KiB)
    wide = write("wide.json", dict(LLAMA3_8B, num_attention_heads=4096, head_dim=128))
    rc, out, err = umbp("size", "--model-config", wide, "--tp", "4096", "--block-size", "1", "--tokens",
                        str(1 << 40))
    assert rc == 2 and "over the 16777215 one pool holds" in err and not out, (rc, out, err)


@check("config fields whose product passes 2^64: refused as over 4 GiB, not wrapped to a small block or a crash")
def _():
    # 2^61 layers x 2 x 4 tokens x 1 head x 1 x 4 bytes = 2^66: wrapped to 0, then a division by zero (SIGFPE)
    zero = write("wrap0.json", {"num_hidden_layers": 1 << 61, "num_attention_heads": 1, "head_dim": 1})
    # (2^62 + 1) x 2 x 4 x 1 x 1 x 2 = 2^66 + 16: wrapped to a 16-byte block
    small = write("wrap16.json", {"num_hidden_layers": (1 << 62) + 1, "num_attention_heads": 1, "head_dim": 1})
    # MLA: (2^63 - 1) + (2^63 - 1) overflowed a signed sum
    mla = write("wrapmla.json", {"num_hidden_layers": 1, "kv_lora_rank": (1 << 63) - 1,
                                 "qk_rope_head_dim": (1 << 63) - 1})
    for cfg, args in ((zero, ["--block-size", "4", "--kv-dtype", "float32"]),
                      (small, ["--block-size", "4", "--kv-dtype", "float16"]), (mla, [])):
        rc, out, err = umbp("size", "--model-config", cfg, "--json", *args)
        assert rc == 2 and "over the 4 GiB a slot can hold" in err and "over 16 EiB" in err, (cfg, rc, out, err)
        assert cfg in err and out == "", (cfg, out, err)


def cleanup():
    subprocess.run([TOOL, "pool", "destroy", POOL, "--force"], capture_output=True)
    shutil.rmtree(TMP, ignore_errors=True)


rc = taplib.run(checks)
cleanup()
sys.exit(rc)

"""How transcribed.csv was derived from Liger-Kernel's example logs (kept for review; not run by the importer).

Usage, in a clone of github.com/linkedin/Liger-Kernel: python transcribe.py OUT.csv
Each log under examples/huggingface/results/ at commit C becomes one row: the last logged step's avg_step_time_sec
and total_peak_memory_allocated_MB, the tokens seen after step 1 and after the last step (seq_len = their difference
/ steps / (4 ranks x per-device batch)), the commit that added the log; skipped logs carry their reason. The
llama_B_48_* row was appended by hand (its reason is in the CSV). seq_len_cv: the spread of the padded length one
rank's micro-batch gets, from the per-step token counts (each the sum over the 4 ranks' independent batches, so
its variance is a quarter of one rank's): 2 x the sample standard deviation of the steps' mean padded lengths /
their mean.

peak_seq_len: the allocated peak is the maximum over the logged steps of rank 0's peak, and rank 0's peak step is
the one whose micro-batch is longest (the collator pads each rank's batch to its longest sample). The logs give
each step's token count over the 4 ranks (num_input_tokens_seen differences), i.e. the mean of the 4 ranks'
padded lengths per step, not rank 0's own. With the ranks' lengths independent draws of one distribution (random
sampling), its mean is the steps' mean and its spread 2 x the standard deviation of the 4-rank means; rank 0's
longest of n logged steps is then expected at mean + spread x E[max of n standard normals], rounded up to the
collator's multiple of 16 and capped at max_seq_length 512 (training.py: truncation)."""
import ast
import csv
import io
import math
import statistics
import subprocess
import sys

C = "1dce7fd4c945cada18b6a86be0050cd03de21180"  # the last commit holding every log
COLS = ("row_id","upstream_path","upstream_lines","upstream_commit","header_date","status","skip_reason","quote","model","gpu","gpus_per_node","nodes","intra_node_bw_gb_per_s","objective","framework","zero","tp","pp","cp","dp","ep","sequence_parallel","recompute","micro_batch","grad_accum","seq_len","optimizer_offload","step_time_s","peak_memory_gib","memory_kind","kernels", "fused_head", "seq_len_cv", "peak_seq_len")
def git(*a):
    return subprocess.run(["git",*a],capture_output=True,text=True,check=True).stdout
# model_type: (catalog model, per-device batch, why that batch)
MODELS = {"llama": ("llama-3.1-8b", 32), "mistral": ("mistral-7b", 32), "qwen2": ("qwen2.5-7b", 24),
          "phi3": ("phi-3-mini", 128), "gemma2": ("gemma-2-2b", 32)}
def expected_max_normal(n):
    """E[max of n independent standard normals], by the trapezoid rule over [-10, 10]."""
    pdf = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))
    xs = [-10 + i * 1e-3 for i in range(20001)]
    ys = [x * n * pdf(x) * cdf(x) ** (n - 1) for x in xs]
    return 1e-3 * (sum(ys) - (ys[0] + ys[-1]) / 2)


def peak_seq_len(toks, bs, ranks=4, multiple=16, cap=512):
    """rank 0's longest padded micro-batch over the logged steps (module docstring); toks: tokens seen after each
    step, the first step's memory not logged."""
    per = [(b - a) / (ranks * bs) for a, b in zip(toks, toks[1:])]
    spread = math.sqrt(ranks) * statistics.stdev(per)
    est = statistics.mean(per) + spread * expected_max_normal(len(per))
    return min(cap, multiple * math.ceil(est / multiple))


rows = []
files = [f for f in git("ls-tree","-r","--name-only",C,"examples/huggingface/results").split() if f.endswith(".log")]
for f in files:
    name = f.split("/")[-1][:-4]
    mt = name.split("_use_liger")[0]
    liger = "_True_" in name
    ptype = name.split("patching_type_")[1]
    add = git("log","--format=%H %ad","--date=short","--diff-filter=A",C,"--",f).split()
    commit, date = add[0], add[1]
    text = git("show", f"{C}:{f}")
    lines = text.splitlines()
    ds = []
    for i, line in enumerate(lines, 1):
        if line.startswith("{") and "train_runtime" not in line:
            try:
                ds.append((i, ast.literal_eval(line.replace("nan", "None"))))
            except (ValueError, SyntaxError):
                pass
    r = dict.fromkeys(COLS, "")
    r.update(row_id=name.replace("_use_liger_", "-liger-").replace("_patching_type_", "-").replace("_", "-"),
             upstream_path=f, upstream_commit=commit, header_date=date)
    steps = [(i, d) for i, d in ds if "avg_step_time_sec" in d]
    if not steps:
        r.update(status="skip", upstream_lines="1", quote=lines[-1][:120] if lines else "",
                 skip_reason={"qwen2_vl": "Qwen2-VL-2B: a vision-language model, not in the model catalog",
                              "mixtral": "Mixtral-8x7B run that logged no training step (the log ends after model load)"}.get(mt, "no step logged"))
        rows.append(r)
        continue
    li, last = steps[-1]
    toks = [d["num_input_tokens_seen"] for _, d in ds]
    n = len(toks) - 1
    quote = (f"step {last['step']}: 'avg_step_time_sec': {last['avg_step_time_sec']}, 'total_peak_memory_allocated_MB': "
             f"{last['total_peak_memory_allocated_MB']}, 'total_peak_memory_reserved_MB': {last['total_peak_memory_reserved_MB']}, "
             f"'num_input_tokens_seen': {last['num_input_tokens_seen']} (after step 1: {toks[0]})")
    r.update(upstream_lines=f"{ds[0][0]};{li}", quote=quote)
    bad_loss = any(d.get("grad_norm") is None or d.get("loss") == 0.0 for _, d in ds)
    if mt not in MODELS:
        r.update(status="skip", skip_reason="Gemma-7B (gemma-7b-it) is not in the model catalog")
    elif bad_loss:
        r.update(status="skip", skip_reason="the run diverged (grad_norm nan, loss 0.0 from step 2): not the step a working run takes")
    elif "_old" in name:
        r.update(status="skip", skip_reason="superseded rerun kept under *_old (an earlier Liger build); the file without the suffix is the current run")
    elif liger and ptype != "pre_init" and not (mt == "gemma2"):
        r.update(status="skip", skip_reason="the same plan and kernels as the -liger-True-pre-init row (another way of applying the same monkey patch): one row per plan is imported, the spread between the patching methods is the run-to-run noise")
    elif liger and mt == "gemma2" and ptype != "post-init-class".replace("-", "_"):
        r.update(status="skip", skip_reason="the same plan and kernels as gemma2-liger-True-post-init-class (the pre_init run diverged); one row per plan is imported")
    else:
        model, bs = MODELS[mt]
        seq = round((toks[-1] - toks[0]) / n / (4 * bs))
        lens = [(b - a) / (4 * bs) for a, b in zip(toks, toks[1:])]
        cv = 2.0 * statistics.stdev(lens) / statistics.fmean(lens)
        r.update(status="ok", model=model, gpu="a100-sxm-80gb", gpus_per_node="4", nodes="1", objective="sft",
                 framework="fsdp", zero="3", tp="1", pp="1", cp="1", dp="4", ep="1", sequence_parallel="false",
                 recompute="full", micro_batch=str(bs), grad_accum="1", seq_len=str(seq), optimizer_offload="false",
                 step_time_s=str(last["avg_step_time_sec"]),
                 peak_memory_gib=f"{last['total_peak_memory_allocated_MB'] / 1024:.4f}", memory_kind="allocated",
                 kernels=("liger" if liger else "") + ("+" if liger else "") + "sdpa+padded_batches",
                 # Liger's fused linear cross entropy: every patched model here but Gemma 2, whose patch at C applies
                 # Liger's cross entropy only (monkey_patch.py:322-350)
                 fused_head="true" if liger and mt != "gemma2" else "false", seq_len_cv=f"{cv:.3f}",
                 peak_seq_len=str(peak_seq_len(toks, bs)))
    rows.append(r)
out = io.StringIO()
w = csv.DictWriter(out, fieldnames=COLS, lineterminator="\n")
w.writeheader()
w.writerows(rows)
open(sys.argv[1], "w").write(out.getvalue())

"""Experiment: page-score aggregations over heads, ppl at budget 2048 on 8K stdlib docs."""
import json
import math
import sys
import time

import torch

import importlib
ref = importlib.import_module("kernels.page_select.reference")
from benchmarks.sparse_quality.driver import Settings, make_llm, teacher_forced_nll
from benchmarks.sparse_quality.tasks import stdlib_documents
from services.decoder.model.loader import load_model
from services.decoder.model.model_store import resolve_model_path

ORIG = ref.page_scores


def make_scores(agg: str, temp: float = 1.0):
    def page_scores(q, digest_min, digest_max, token_req, token_pos, *, sink_pages, recent_pages, page_size):
        T, H, D = q.shape
        _, P, KVH, _ = digest_min.shape
        G = H // KVH
        sink_end, recent_start, _ = ref.candidate_bounds(token_pos, sink_pages=sink_pages, recent_pages=recent_pages,
                                                         page_size=page_size)
        scores = torch.full((T, P), float("-inf"))
        used = min(int(recent_start.max()), P) if T else 0
        if used == 0:
            return scores
        qf = q.float().view(T, KVH, G, D)
        pids = torch.arange(used)
        for s in range(0, T, 16):
            rows = slice(s, s + 16)
            req = token_req[rows].long()
            dmax = digest_max[req, :used].float()  # [c, P, KVH, D]
            dmin = digest_min[req, :used].float()
            qp = qf[rows].clamp(min=0)[:, None]  # [c,1,KVH,G,D]
            qn = qf[rows].clamp(max=0)[:, None]
            b = (dmax[:, :, :, None, :] * qp + dmin[:, :, :, None, :] * qn).sum(-1)  # [c, P, KVH, G]
            cand = (pids >= sink_end[rows, None]) & (pids < recent_start[rows, None])  # [c, P]
            m = cand[:, :, None, None]
            if agg in ("center_sum", "center_softmax") or agg.startswith("mix"):
                c = (dmax + dmin) / 2
                cl = (c[:, :, :, None, :] * qf[rows][:, None]).sum(-1)  # [c, P, KVH, G]
                if agg == "center_sum":
                    sc = cl.sum((2, 3))
                else:
                    a = temp if agg.startswith("mix") else 0.0
                    est = (a * b + (1 - a) * cl) / math.sqrt(D)
                    est = est.masked_fill(~m, float("-inf"))
                    sc = torch.nan_to_num(torch.softmax(est, dim=1), nan=0.0).sum((2, 3))
            elif agg == "mean_softmax":
                slots = CTX["tables"][req, :used].long()  # [c, P]
                keys = CTX["pool"].k[CTX["layer"]][slots.clamp(min=0)].float().mean(2)  # [c, P, KVH, D]
                cl = (keys[:, :, :, None, :] * qf[rows][:, None]).sum(-1)
                est = (cl / math.sqrt(D)).masked_fill(~m, float("-inf"))
                sc = torch.nan_to_num(torch.softmax(est, dim=1), nan=0.0).sum((2, 3))
            elif agg == "sum":
                sc = b.sum((2, 3))
            else:
                s_ = (b / math.sqrt(D) / temp).masked_fill(~m, float("-inf"))
                if agg == "softmax_sum":
                    w = torch.softmax(s_, dim=1)
                    sc = torch.nan_to_num(w, nan=0.0).sum((2, 3))
                elif agg == "max_norm":
                    sc = (s_ - s_.amax(1, keepdim=True)).amax((2, 3))
                elif agg == "kv_softmax":
                    sk = (b.sum(3) / math.sqrt(D) / temp).masked_fill(~cand[:, :, None], float("-inf"))
                    sc = torch.nan_to_num(torch.softmax(sk, dim=1), nan=0.0).sum(2)
                else:
                    raise ValueError(agg)
            scores[rows, :used] = torch.where(cand, sc, float("-inf"))
        return scores
    return page_scores


def main():
    variants = sys.argv[1:]
    loaded = load_model(resolve_model_path(None))
    settings = Settings()
    docs = [ids for _, ids in stdlib_documents(loaded.tokenizer, 8192, 4)]
    out = {}
    for v in variants:
        t = time.time()
        if v == "dense":
            ref.page_scores = ORIG
            budget = None
        else:
            budget = 2048
            if v == "orig":
                ref.page_scores = ORIG
            elif v == "oracle":
                ref.page_scores = install_oracle()
            elif v == "mean_softmax":
                install_oracle()
                ref.page_scores = make_scores("mean_softmax")
            else:
                name, _, temp = v.partition("@")
                ref.page_scores = make_scores(name, float(temp or (0.0 if name == "mix" else 1.0)))
        llm = make_llm(loaded, settings, budget, 4 * 8192)
        recs = teacher_forced_nll(llm, docs, 256)
        nll = sum(r["nll"] for r in recs)
        n = sum(r["tokens"] for r in recs)
        per_doc = [math.exp(r["nll"] / r["tokens"]) for r in recs]
        out[v] = {"ppl": math.exp(nll / n), "per_doc": per_doc, "s": time.time() - t}
        print(v, json.dumps(out[v]), flush=True)
        llm.engine.close() if hasattr(llm.engine, "close") else None
    if "dense" in out:
        for v, r in out.items():
            print(f"{v:>16} ppl {r['ppl']:.4f}  +{(r['ppl'] / out['dense']['ppl'] - 1) * 100:.2f}%")




# ---- oracle: true attention mass per page (keys from the hot pool), summed over heads ----
CTX = {}


def install_oracle():
    from services.decoder.model.attention import PagedAttention
    orig = PagedAttention._page_list_forward

    def patched(self, layer, q, tokens):
        CTX.update(layer=layer, pool=self.pool, tables=tokens.page_tables, scale=self.scale)
        return orig(self, layer, q, tokens)
    PagedAttention._page_list_forward = patched

    def page_scores(q, digest_min, digest_max, token_req, token_pos, *, sink_pages, recent_pages, page_size):
        T, H, D = q.shape
        _, P, KVH, _ = digest_min.shape
        G = H // KVH
        sink_end, recent_start, _ = ref.candidate_bounds(token_pos, sink_pages=sink_pages, recent_pages=recent_pages,
                                                         page_size=page_size)
        scores = torch.full((T, P), float("-inf"))
        pool, tables, layer = CTX["pool"], CTX["tables"], CTX["layer"]
        K = pool.k[layer]  # [slots, page, KVH, D]
        for t in range(T):
            used = int(recent_start[t])
            s0 = int(sink_end[t])
            if used <= s0:
                continue
            slots = tables[int(token_req[t]), :used].long()
            keys = K[slots].float()  # [used, page, KVH, D]
            qh = q[t].float().view(KVH, G, D)
            logits = torch.einsum("kgd,pskd->kgps", qh, keys) * CTX["scale"]  # [KVH, G, used, page]
            # softmax over the whole context up to the recent window start (incl. sink), per head
            w = torch.softmax(logits.reshape(KVH, G, -1), dim=-1).view(KVH, G, used, page_size)
            mass = w.sum((0, 1, 3))  # [used]
            scores[t, s0:used] = mass[s0:used]
        return scores
    return page_scores


if __name__ == "__main__":
    main()

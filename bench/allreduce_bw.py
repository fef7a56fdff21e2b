"""All-reduce bandwidth between the GPUs of this host through torch.distributed's NCCL backend, as
nccl-tests reports it: algorithm bandwidth (bytes / time) and bus bandwidth (bytes x 2(N-1)/N / time),
bf16, per message size. docs/distributed.md's multi-host estimate takes B_nvl from it. Writes
allreduce_bw.json.

  python3 bench/allreduce_bw.py [--out DIR] [--gpus 2] [--mib 25,256,1024] [--iters 20]

`--device cpu` runs it on Gloo (a check of this script, not a figure).
"""
import json
import os
import socket
import sys
import time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import bench_cli


def rank_main(rank, a, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=a.gpus)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for mib in (int(m) for m in a.mib.split(",")):
        x = torch.zeros(mib * 2**20 // 2, dtype=torch.bfloat16, device=dev)
        for _ in range(3):
            dist.all_reduce(x)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            dist.all_reduce(x)
        sync()
        dt = (time.perf_counter() - t0) / a.iters
        size = x.numel() * x.element_size()
        rows.append({"mib": mib, "time_s": dt, "algbw_gbs": size / dt / 1e9,
                     "busbw_gbs": size * 2 * (a.gpus - 1) / a.gpus / dt / 1e9})
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main():
    ap = bench_cli.parser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--mib", default="25,256,1024", help="message sizes in MiB (25: one gradient bucket)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = ap.parse_args()
    # NVLink multicast stays off (docs/distributed.md); the ranks inherit it.
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(rank_main, args=(a, port, queue), nprocs=a.gpus, join=True, start_method="spawn")
    rows = queue.get()
    print(f"all-reduce, bf16, {a.gpus} ranks ({'NCCL' if a.device == 'cuda' else 'Gloo, CPU'}), {a.iters} iterations\n")
    print("| size | time | algbw | busbw |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mib']} MiB | {r['time_s'] * 1e3:.2f} ms | {r['algbw_gbs']:.1f} GB/s | {r['busbw_gbs']:.1f} GB/s |")
    out = bench_cli.out_dir(a)
    (out / "allreduce_bw.json").write_text(json.dumps({"gpus": a.gpus, "device": a.device, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

# execute()'s thread CPU a request, from the delivery timers of one e2e run (tiny model, engine worker process)
cd /work/main
rm -rf /tmp/ec && mkdir -p /tmp/ec
TRTLLM_DELIVERY_TIMING_S=2 .venv/bin/python bench/e2e.py --device cpu --tiny-model --loads 64 --max-tokens 16 --engine-process true --skip-in-process --warmup 3 --window 10 --client-procs 2 --results-dir /tmp/ec 2>&1 | grep "via Triton"
grep -h "delivery timing over 2" /tmp/ec/e2e-server-*/server.log | sed 's/.*timing over//' | python3 -c '
import sys,re
rows=[]
for l in sys.stdin:
    m=re.search(r"(\d+) responses/s.*detokenize=([\d.]+) tensors=([\d.]+) triton_tensors=([\d.]+).*send=([\d.]+); execute: ([\d.]+) calls/s, ([\d.]+) requests a call, ([\d.]+) ms a call \(thread CPU ([\d.]+) ms\)",l)
    if m and float(m.group(6))>1: rows.append([float(x) for x in m.groups()])
rows=rows[1:-1]
import statistics as s
print("periods",len(rows),"responses/s",[int(r[0]) for r in rows])
print("execute CPU us a request", [round(1000*r[8]/r[6]) for r in rows], "wall", [round(1000*r[7]/r[6]) for r in rows])
print("detok/tensors/triton_tensors us", [ (round(r[1]),round(r[2]),round(r[3])) for r in rows])
'

# Run from the repository root: python3 bench/results/x8-20261122/model_check.py [alpha piece_rs_us piece_ag_us]
# A Python copy of the GEMM+communication cost model (predict_baseline / predict_decomposed in
# src/ops/gemm_overlap.cpp, constants of bench/constants/h200x2.json) against the 2/4/8-GPU runs:
# per point the measured and predicted baseline and decomposed (the model's own chunk choice), and
# whether auto's baseline-vs-decomposed choice matches the measurement; then the NCCL rate each
# baseline implies. Without arguments it is the code's model; with them, the candidate
# recalibration (NOT in the C++ code): NCCL's rate 0.66 x 395 x (2(W-1)/W)^alpha and a fixed cost
# per peer piece of the decomposed pipelines (gemm_rs, ag_gemm), e.g. 0.44 15.7 10.5.
import json, glob, math, sys
TF=761; CE=395; HBM=4300; LAT=1.25
L=4.0; CP=2.0; NCU=12.0; W_US=2.0
ALPHA=float(sys.argv[1]) if len(sys.argv)>1 else 0.0
PIECE=float(sys.argv[2]) if len(sys.argv)>2 else 0.0
PIECE_AG=float(sys.argv[3]) if len(sys.argv)>3 else 0.0
def nccl(w): return 0.66*CE*(2*(w-1)/w)**ALPHA
def gemm(r,n,k): return 2*r*n*k/(TF*1e6)+L
def copy(b): return b/(CE*1e3)+CP
def coll(b,w): return b/(nccl(w)*1e3)+NCU
def base(op,w,m,n,k):
    kl=k/w; f=(w-1)/w
    if op=='ag_gemm': return coll(f*m*k*2,w)+gemm(m,n,k)
    if op=='gemm_rs': return gemm(m,n,kl)+coll(f*m*n*2,w)
    return gemm(m,n,kl)+coll(2*f*m*n*2,w)
def dec(op,w,m,n,k,ch,fold='none'):
    kl=k/w; ml=m/w; piece=ml/ch
    if op=='ag_gemm':
        t=gemm(ml,n,k); cp=copy(piece*k*2)
        for i in range((w-1)*ch): t=max(t,(i+1)*cp+LAT+W_US)+gemm(piece,n,k)+PIECE_AG
        return t
    if op=='gemm_rs':
        t=0; ce=0; cp=copy(piece*n*2); arr=[0]*ch
        for i in range((w-1)*ch):
            t+=gemm(piece,n,kl)+PIECE; ce=max(ce,t)+cp; arr[i%ch]=ce+LAT
        if fold=='lt':
            for j in range(ch): t=max(t,arr[j]+W_US)+gemm(piece,n,kl)
            return t
        t+=gemm(ml,n,kl)
        return max(t,ce+LAT)+(w+1)*ml*n*2/(HBM*1e3)+L
    rows=m/ch; f=(w-1)/w; t=0
    for i in range(ch):
        t+=gemm(rows,n,kl)
        if w>1: t+=2*f*rows*n*2/(CE*0.8e3)+8
    return t
files={2:'bench/results/{op}-nccl-2r-20261122-1035*.json',4:'bench/results/{op}-nccl-4r-20261122-06*.json',8:'bench/results/x8-20261122/{op}-nccl-8r-*.json'}
wrong=0; tot=0
for w,pat in files.items():
  for op in ['ag_gemm','gemm_rs','gemm_ar']:
    j=json.load(open(sorted(glob.glob(pat.format(op=op)))[-1]))
    pts={(p['m'],p['k'],p['n'],p['method']):p for p in j['points']}
    for (m,k,n,meth),p in pts.items():
        if meth!='decomposed': continue
        b=pts[(m,k,n,'baseline')]['median_us']; d=p['median_us']
        fold='lt' if (op=='gemm_rs' and w==2 and 2*(m/2)*n*(k/2)/(TF*1e6)+L>=100) else 'none'
        pb=base(op,w,m,n,k)
        best=min((dec(op,w,m,n,k,ch,fold),ch) for ch in (1,2,4,8) if ch<=m/w)
        pd,ch=best
        ok=(d<b)==(pd<pb); tot+=1; wrong+= (not ok)
        print(f"w{w} {op:8s} {m}x{k}x{n:<6} base {b:7.1f}/{pb:7.1f} ({pb/b:4.2f}) dec {d:7.1f} (ch {p['chunks']})/{pd:7.1f} ch {ch} ({pd/d:4.2f}) {'ok' if ok else 'WRONG'}")
print("wrong", wrong, "of", tot)

print("\nimplied NCCL rate (GB/s) = bytes / (baseline - gemm_only - 12us)")
for w,pat in files.items():
  for op in ['ag_gemm','gemm_rs','gemm_ar']:
    fs=sorted(glob.glob(pat.format(op=op)))
    j=json.load(open(fs[-1])); pts={(p['m'],p['k'],p['n'],p['method']):p for p in j['points']}
    for (m,k,n,meth),p in pts.items():
        if meth!='baseline': continue
        g=pts[(m,k,n,'gemm_only')]['median_us']; b=p['median_us']; f=(w-1)/w
        by = f*m*k*2 if op=='ag_gemm' else (f*m*n*2 if op=='gemm_rs' else 2*f*m*n*2)
        print(f"w{w} {op} {m}x{k}x{n}: comm {b-g:7.1f} us, {by/1e6:7.1f} MB -> {by/((b-g-12)*1e3):6.1f} GB/s")

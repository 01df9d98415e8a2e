# Run from the repository root:
#   python3 bench/results/model-20261122/model_check.py [alpha piece_rs_us piece_ag_us fused_ag fused_rs fused_peer_us]
# A Python copy of the GEMM+communication cost model of src/ops/gemm_overlap_model.cpp (constants
# of bench/constants/h200x2.json) against the measured runs, with every method auto can choose:
# per point the measured baseline / decomposed / fused, the model's choice among them, and its
# regret (measured time of the choice / the fastest measured - 1). Runs: 2 GPUs 2026-11-22 13:04
# (random data, interleaved timing), 4 GPUs 06:2x (their fused column is not valid: left out),
# 8 GPUs 10:40. Arguments: NCCL's rate 0.66 x 395 x (2(W-1)/W)^alpha; a fixed cost per peer
# piece of the decomposed pipelines (gemm_rs, ag_gemm); the fused ag_gemm / gemm_rs: GEMM time
# at the library rate divided by fused_ag / fused_rs (0: gemm_rs fused not modelled), plus 10 us
# and fused_peer_us per peer.
# Defaults: the code's constants.
import json, glob, sys
TF=761; CE=395; HBM=4300; LAT=1.25
L=4.0; CP=2.0; NCU=12.0; W_US=2.0
a=[float(x) for x in sys.argv[1:]]
ALPHA,PIECE,PIECE_AG,FUSED_AG,FUSED_RS,FUSED_PEER=(a+[0.44,15.7,10.5,0.95,0.0,10.5][len(a):])[:6]
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
    if op=='gemm_rs' and fold=='gather':
        t=gemm(ml,n,kl); ce=copy(ml*kl*2)
        for j in range(ch):
            ce+=copy(n*kl*2/ch); t=max(t,ce+LAT+W_US)+gemm(ml,n/ch,kl)
        return t
    if op=='gemm_rs':
        t=0; ce=0; cp=copy(piece*n*2); arr=[0]*ch
        for i in range((w-1)*ch):
            t+=gemm(piece,n,kl)+PIECE; ce=max(ce,t)+cp; arr[i%ch]=ce+LAT
        if fold=='lt':
            for j in range(ch): t=max(t,arr[j]+W_US)+gemm(piece,n,kl)
            return t
        if fold=='weft':
            per=(gemm(ml,n,kl)-L)/ch; t+=L
            for j in range(ch): t=max(t,arr[j])+per
            return t
        t+=gemm(ml,n,kl)
        return max(t,ce+LAT)+(w+1)*ml*n*2/(HBM*1e3)+L
    rows=m/ch; f=(w-1)/w; t=0
    for i in range(ch):
        t+=gemm(rows,n,kl)
        if w>1: t+=2*f*rows*n*2/(CE*0.8e3)+8
    return t
def fused(op,w,m,n,k):
    kl=k if op=='ag_gemm' else k/w; f=(w-1)/w
    eff=FUSED_AG if op=='ag_gemm' else FUSED_RS
    if op=='gemm_ar' or eff<=0: return None
    g=2*m*n*kl/(TF*1e6)/eff
    by=f*m*k*2 if op=='ag_gemm' else f*m*n*2
    return max(g,by/(CE*1e3))+10+FUSED_PEER*(w-1)
def fold_of(op,w,m,n,k):
    if op!='gemm_rs' or w<2: return 'none'
    own=gemm(m/w,n,k/w)
    if w==2 and copy((m/w+n)*(k/w)*2)+LAT<=own: return 'gather'
    if w==2 and own>=100: return 'lt'
    # default_rs_fold: otherwise weft's fold where the reduce pass would take >= 60 us
    red=(w+1)*(m/w)*n*2/(HBM*1e3)
    return 'weft' if red>=60.0 else 'none'
files={2:'bench/results/{op}-nccl-2r-20261122-1304*.json',4:'bench/results/{op}-nccl-4r-20261122-06*.json',8:'bench/results/x8-20261122/{op}-nccl-8r-*.json'}
fused_valid={2:True,4:False,8:True}
tot=0; wrong=0; regret=[]
for w,pat in files.items():
  for op in ['ag_gemm','gemm_rs','gemm_ar']:
    j=json.load(open(sorted(glob.glob(pat.format(op=op)))[-1]))
    pts={(p['m'],p['k'],p['n'],p['method']):p for p in j['points']}
    for (m,k,n,meth),p in sorted(pts.items()):
        if meth!='baseline': continue
        meas={'baseline':p['median_us'],'decomposed':pts[(m,k,n,'decomposed')]['median_us']}
        fu=pts.get((m,k,n,'fused'),{}).get('median_us',0)
        if fused_valid[w] and fu>0: meas['fused']=fu
        fold=fold_of(op,w,m,n,k)
        pred={'baseline':base(op,w,m,n,k)}
        pred['decomposed'],ch=min((dec(op,w,m,n,k,c,fold),c) for c in (1,2,4,8) if c<=m/w)
        pf=fused(op,w,m,n,k)
        if pf is not None and 'fused' in meas: pred['fused']=pf
        choice=min(pred,key=pred.get); best=min(meas,key=meas.get)
        r=meas[choice]/meas[best]-1; regret.append(r); tot+=1; wrong+=r>0.03
        cells=' '.join(f"{k_[:4]} {meas[k_]:7.1f}/{pred.get(k_,0):7.1f}" for k_ in meas)
        print(f"w{w} {op:8s} {m}x{k}x{n:<6} {cells}  chose {choice[:4]} best {best[:4]} regret {100*r:5.1f}%{'  <-- >3%' if r>0.03 else ''}")
print(f"params alpha {ALPHA} piece_rs {PIECE} piece_ag {PIECE_AG} fused_ag {FUSED_AG} fused_rs {FUSED_RS} fused_peer {FUSED_PEER}: "
      f"{wrong} of {tot} choices >3% off the fastest; mean regret {100*sum(regret)/len(regret):.1f}%, max {100*max(regret):.1f}%")

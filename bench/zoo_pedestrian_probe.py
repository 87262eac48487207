"""Probe the pedestrian model's hand-designed channel on the simulator's scenes.

Prints, per resolution, frame time and score_threshold: N boxes, how many overlap a ground-truth
pedestrian, and how many pedestrians got a box. Run: .venv/bin/python bench/zoo_pedestrian_probe.py
"""
import numpy as np, onnxruntime as ort
from dynnet_ros.zoo import build_model
from dynnet_ros.nodes import scene as sc
s = ort.InferenceSession(build_model("pedestrian").SerializeToString(), providers=["CPUExecutionProvider"])
for W,H in ((640,480),(1280,736),(320,256)):
  for t in (0.0, 1.0, 3.0, 7.0):
    scn = sc.make_scene(t); img,_ = sc.render_camera(scn, W, H)
    k = sc.camera_matrix(W,H); gt=[]
    for p in scn.pedestrians:
        gt.append((k[0,0]*(-(p.y+p.width/2)/p.x)+k[0,2], k[1,1]*(sc.CAMERA_HEIGHT-p.height)/p.x+k[1,2], k[0,0]*(-(p.y-p.width/2)/p.x)+k[0,2], k[1,1]*sc.CAMERA_HEIGHT/p.x+k[1,2]))
    x = (img.astype(np.float32)/255).transpose(2,0,1)[None]
    res=[]
    for thr in (0.2,0.5,0.8):
        b, q = s.run(None, {"image": x, "score_threshold": np.array([thr],np.float32), "iou_threshold": np.array([0.45],np.float32), "max_detections": np.array([100],np.int64)})
        on = sum(any(bb[0] < g[2] and bb[2] > g[0] and bb[1] < g[3] and bb[3] > g[1] for g in gt) for bb in b)
        found = sum(any(bb[0] < g[2] and bb[2] > g[0] and bb[1] < g[3] and bb[3] > g[1] for bb in b) for g in gt if g[0] < W and g[2] > 0)
        res.append(f"thr{thr}: N={len(b)} on-ped={on} peds-found={found}/{sum(1 for g in gt if g[0]<W and g[2]>0)}")
    print(W,H,t, " | ".join(res))

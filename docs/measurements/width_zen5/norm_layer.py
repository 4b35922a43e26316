# The instance norm layer alone, forward and backward, channels-last against the planar view
# (brats_seg/model/norm.py), per channel count and dtype, best of 3 after a warm-up:
#   .venv/bin/python docs/measurements/width_zen5/norm_layer.py 192x224x160   (output: norm_layer.txt)
import os, time, sys
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"; os.environ["TF_CPP_MIN_LOG_LEVEL"]="2"
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(2); tf.config.threading.set_inter_op_parallelism_threads(2)
S = (96, 112, 80) if len(sys.argv) < 2 else tuple(map(int, sys.argv[1].split("x")))
def nhwc(x, g, b):
    _, sx, sy, sz, c = x.shape
    y, _, _ = tf.compat.v1.nn.fused_batch_norm(tf.reshape(x, (1, sx, sy*sz, c)), g, b, data_format="NHWC", is_training=True)
    return tf.reshape(y, x.shape)
def nchw(x, g, b):
    _, sx, sy, sz, c = x.shape
    xt = tf.reshape(tf.transpose(tf.reshape(x, (1, sx*sy*sz, c)), (0, 2, 1)), (1, c, sx, sy*sz))
    y, _, _ = tf.compat.v1.nn.fused_batch_norm(xt, g, b, data_format="NCHW", is_training=True)
    return tf.reshape(tf.transpose(tf.reshape(y, (1, c, sx*sy*sz)), (0, 2, 1)), x.shape)
for dt in (tf.float32, tf.bfloat16):
    for c in (4, 6, 8, 12, 16, 24):
        x = tf.cast(tf.random.normal((1, *S, c)), dt); dy = tf.cast(tf.random.normal((1, *S, c)), dt)
        g = tf.ones((c,)); b = tf.zeros((c,))
        res = {}
        for name, fn in (("nhwc", nhwc), ("nchw", nchw)):
            @tf.function
            def step(x, dy):
                with tf.GradientTape() as t:
                    t.watch(x); y = fn(x, g, b)
                return t.gradient(y, x, output_gradients=dy), y
            try:
                out = step(x, dy)
                best = 1e9
                for _ in range(3):
                    t0 = time.perf_counter(); o = step(x, dy); o[0].numpy(); best = min(best, time.perf_counter() - t0)
                res[name] = (best, out)
            except Exception as e:
                res[name] = (float("nan"), None); print(name, "failed", str(e)[:200])
        d = float(tf.reduce_max(tf.abs(tf.cast(res["nhwc"][1][1], tf.float32) - tf.cast(res["nchw"][1][1], tf.float32)))) if res["nchw"][1] else None
        print(f"{dt.name:9s} C={c:3d}  nhwc {res['nhwc'][0]*1e3:8.1f} ms  nchw {res['nchw'][0]*1e3:8.1f} ms  max|dy| {d}", flush=True)

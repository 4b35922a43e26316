import json, glob, os, statistics as st
base = '/work/main/outputs/patches_vs_whole_full'
for arm in ('null', '128x128x128', '96x96x96'):
    d = f'{base}/patch_size-{arm}_seed-0'
    if not os.path.exists(f'{d}/state.json'):
        continue
    s = json.load(open(f'{d}/state.json')); h = s['history']
    steps = sum(round(r['train_s'] / r['step_s']) for r in h)
    med = st.median(r['step_s'] for r in h)
    peak = max(r.get('peak_bytes', 0) for r in h) / 1e9
    val = sum(r['val_s'] for r in h)
    out = [arm, f'epochs {len(h)}', f'steps~{steps}', f'step {med:.2f}s', f'peak {peak:.2f}GB', f'val {val:.0f}s',
           f'best val {s["best_value"]:.3f}@{s["best_epoch"]}', f'train {s["train_time_s"]:.0f}s']
    p = f'{d}/eval/test/summary.json'
    if os.path.exists(p):
        e = json.load(open(p))
        out.append(' '.join(f'{k}{r}={e[k + r]["mean"]:.3f}' for k in ('dice_', 'hd95_', 'lesion23_dice_') for r in ('wt', 'tc', 'et')))
    print(' | '.join(out))

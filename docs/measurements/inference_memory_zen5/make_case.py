#!/usr/bin/env python
"""A raw case on another native grid: the four images of a BraTS-2021-named case folder resampled
(linear, SimpleITK) to an isotropic spacing, written under the same names; no label.

    python docs/measurements/inference_memory_zen5/make_case.py data/mni_gliomas_heldout/MNIG_00001 0.8 /tmp/w/in_08
"""

import sys
from pathlib import Path

import SimpleITK as sitk


def main(case_dir: str, spacing: str, out_root: str) -> None:
    case_dir, mm = Path(case_dir), float(spacing)
    out = Path(out_root) / f"{case_dir.name}r"
    out.mkdir(parents=True, exist_ok=True)
    for modality in ("flair", "t1", "t1ce", "t2"):
        image = sitk.ReadImage(str(case_dir / f"{case_dir.name}_{modality}.nii.gz"))
        size = [round(n * s / mm) for n, s in zip(image.GetSize(), image.GetSpacing())]
        resampled = sitk.Resample(
            image, size, sitk.Transform(), sitk.sitkLinear, image.GetOrigin(), (mm, mm, mm), image.GetDirection()
        )
        sitk.WriteImage(resampled, str(out / f"{out.name}_{modality}.nii.gz"))
    print(out, size)


if __name__ == "__main__":
    main(*sys.argv[1:4])

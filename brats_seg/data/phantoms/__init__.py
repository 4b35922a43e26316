"""Generated datasets with known answers: for the demo, the tests and the studies.

::

    synthetic     procedural BraTS-like gliomas (ellipsoid lesions, FLAIR-bright decoys,
                  patchy edema, bias fields) in any layout (brats2021/2023/2024, msd);
                  write_synthetic_dataset
    mni_gliomas   real anatomy: the MNI152 templates with gliomas grown by reaction-diffusion
                  along white matter, written in the brats2021 layout (half of them stored
                  LPS); write_mni_glioma_dataset
    writer        the one writer both use: a case's files where data/layouts.py puts them,
                  labels last, MSD's dataset.json; check_generator_args

Case ``i`` of a dataset comes from ``np.random.default_rng([seed, i])``, so it does not depend
on how many cases are written, and complete cases already on disk are kept.
"""

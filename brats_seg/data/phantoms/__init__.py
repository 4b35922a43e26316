"""Generated datasets with known answers: for the demo, the tests and the studies.

::

    synthetic     procedural BraTS-like gliomas (ellipsoid lesions, FLAIR-bright decoys,
                  patchy edema, bias fields) in any layout (brats2021/2023/2024, msd):
                  the case (generate_case, add_resection_cavity) and write_synthetic_dataset
    anatomy       its healthy brain on a 2 mm working grid: tissues and the structures that
                  mimic tumour, normal contrasts, bias fields, and the field helpers
    tumour        its glioma: foci, nested edema/core/necrosis level sets, tumour contrast,
                  tissue codes and painting into the images
    mni_gliomas   real anatomy: the MNI152 templates with gliomas grown by reaction-diffusion
                  along white matter, written in the brats2021 layout (half of them stored
                  LPS); write_mni_glioma_dataset
    writer        the one writer both generators use: a case's files where data/layouts.py
                  puts them, labels last, MSD's dataset.json; check_generator_args

synthetic draws a case's parameters, builds the brain with anatomy, places and paints the
tumour with tumour (which uses anatomy's field helpers), and upsamples to 1 mm; arrows point
synthetic -> tumour -> anatomy only. Case ``i`` of a dataset comes from
``np.random.default_rng([seed, i])``, so it does not depend on how many cases are written,
and complete cases already on disk are kept.
"""

"""The data layer: from a dataset on disk to cached, validated volumes on the network grid.

Read in the order a case travels::

    layouts     where a layout keeps a case's files (discovery, and the paths generators write);
                the one module that knows file names
    predict_inputs
                what scripts/predict.py input= names (a case folder, a 4D image, a .txt list...),
                resolved into cases with layouts' rules
    labels      each layout's label values, the regions (WT, TC, ET[, RC]), the model's outputs
    nifti       NIfTI in and out with nibabel, in RAS, the original grid kept
    nifti_header  a header checked before any voxel is read: malformed or hostile files refused
                in one line naming them, never read as garbage or allocated at their declared size
    case_io     one case's images and label map, loaded and checked (the one reader)
    preprocess  resample, normalise, crop to the network grid, and the inverse for predictions;
                describe_preprocessing says so as data (an export's preprocessing.json)
    cache       one folder per case (image.npy, regions.npy, meta.json), written atomically
    workers     the processes that prepare cases in parallel, stopped by the parent alone
    prep_memory how many cases fit in memory at once; what to change when one does not
    splits      the seeded train/val/test split
    dataset     discover -> validate -> preprocess -> cache -> split: prepare_dataset
    pipeline    tf.data over the cache (augmentation, batches, resumable order); imports TensorFlow
    augment     the nnunet augmentation preset (batchgenerators, numpy), seeded per case
    errors      what was wrong, with which case and file, and what to do
    phantoms/   generated datasets: the synthetic and MNI glioma generators (and the MNI cases acquired
                as another scanner would: the shifted test set) and their writer

Arrows point down only: this package imports nothing of brats_seg but config.py, files.py,
locks.py and the standard-library leaves (choices, signals, memory).
"""

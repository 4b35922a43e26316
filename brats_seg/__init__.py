"""brats-seg: 3D U-Net brain-tumour segmentation with Large Model Support."""

"""brats_seg.evaluation"""

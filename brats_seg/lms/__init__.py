"""brats_seg.lms"""

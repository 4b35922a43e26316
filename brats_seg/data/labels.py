"""Label conventions of the dataset layouts: the one module that owns them, as data.

Every layout stores a single label map per case; the project trains on binary regions,
channels-last ``(x, y, z, R)``, one sigmoid output per region, in the table's order:

=========  =====================================  ========  ======  ====  ====
layout     labels                                 WT        TC      ET    RC
=========  =====================================  ========  ======  ====  ====
msd        1 edema, 2 non-enh., 3 enh.            1,2,3     2,3     3
brats2021  1 NCR/NET, 2 ED, 4 ET                  1,2,4     1,4     4
brats2023  1 NETC, 2 SNFH, 3 ET                   1,2,3     1,3     3
brats2024  1 NETC, 2 SNFH, 3 ET, 4 RC             1,2,3     1,3     3     4
=========  =====================================  ========  ======  ====  ====

A layout is a :class:`LabelTable`: its label values and names, its regions (name and the
label values forming each) and the order in which predicted regions are painted back
into a label map (:func:`regions_to_labels`; later entries win, so ET > TC > WT as BraTS
nests them, and tumour labels win over the resection cavity). Adding a layout is adding
a table, not a code path. :func:`regions_to_labels` is the exact inverse of
:func:`labels_to_regions` on any label map of the layout's set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from brats_seg.choices import check_choice
from brats_seg.config import Regions

if TYPE_CHECKING:  # a type only: the config schemas import nothing of data/
    from brats_seg.config import TrainConfig

__all__ = [
    "LABELS",
    "REGION_TITLES",
    "LabelTable",
    "Region",
    "check_label_map",
    "invalid_label_values",
    "label_table",
    "labels_to_regions",
    "output_regions",
    "region_label_values",
    "region_names",
    "region_parents",
    "regions_to_labels",
    "resolve_model_outputs",
]

# Human names of the regions, for messages, tables and overlays.
REGION_TITLES = {"wt": "whole tumour", "tc": "tumour core", "et": "enhancing tumour", "rc": "resection cavity"}


@dataclass(frozen=True)
class Region:
    """A binary training/scoring region: the union of some label values."""

    name: str  # "wt", "tc", "et", "rc"
    labels: tuple[int, ...]  # label values of the layout that form it


@dataclass(frozen=True)
class LabelTable:
    """The label convention of one layout.

    Attributes:
        names: label value -> the layout's own name for it (background 0 excluded).
        regions: the regions, in model output order (WT first: WT-only models use channel 0).
        paint_order: ``(region, label)`` pairs; writing predicted regions as a label map
            paints each region's voxels with its label in this order, later pairs winning.
        roles: tissue role -> label value (``edema``, ``core``, ``enhancing``, ``cavity``),
            for data generators and single-region masks.
    """

    names: Mapping[int, str]
    regions: tuple[Region, ...]
    paint_order: tuple[tuple[str, int], ...]
    roles: Mapping[str, int]

    @property
    def values(self) -> tuple[int, ...]:
        """All valid values, background first."""
        return (0, *sorted(self.names))

    @property
    def region_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)

    @property
    def edema(self) -> int:
        return self.roles["edema"]

    @property
    def core(self) -> int:
        return self.roles["core"]

    @property
    def enhancing(self) -> int:
        return self.roles["enhancing"]

    @property
    def cavity(self) -> int | None:
        return self.roles.get("cavity")


def _table(names: dict[int, str], roles: dict[str, int], cavity: bool = False) -> LabelTable:
    """The BraTS region scheme (WT = all tumour labels, TC = core + enhancing, ET) over ``roles``."""
    edema, core, enhancing = roles["edema"], roles["core"], roles["enhancing"]
    regions = [
        Region("wt", tuple(sorted((edema, core, enhancing)))),
        Region("tc", tuple(sorted((core, enhancing)))),
        Region("et", (enhancing,)),
    ]
    paint = [("wt", edema), ("tc", core), ("et", enhancing)]
    if cavity:
        regions.append(Region("rc", (roles["cavity"],)))
        paint.insert(0, ("rc", roles["cavity"]))  # painted first: tumour labels win an overlap
    return LabelTable(MappingProxyType(names), tuple(regions), tuple(paint), MappingProxyType(roles))


LABELS: Mapping[str, LabelTable] = MappingProxyType(
    {
        "msd": _table(
            {1: "edema", 2: "non-enhancing tumour", 3: "enhancing tumour"}, {"edema": 1, "core": 2, "enhancing": 3}
        ),
        "brats2021": _table({1: "NCR/NET", 2: "ED", 4: "ET"}, {"edema": 2, "core": 1, "enhancing": 4}),
        "brats2023": _table({1: "NETC", 2: "SNFH", 3: "ET"}, {"edema": 2, "core": 1, "enhancing": 3}),
        "brats2024": _table(
            {1: "NETC", 2: "SNFH", 3: "ET", 4: "RC"}, {"edema": 2, "core": 1, "enhancing": 3, "cavity": 4}, cavity=True
        ),
    }
)


def label_table(layout: str) -> LabelTable:
    """The :class:`LabelTable` of ``layout``; ValueError naming the layouts for an unknown one."""
    try:
        return LABELS[layout]
    except KeyError:
        raise ValueError(f"Unknown layout {layout!r}; expected one of {sorted(LABELS)}.") from None


def region_names(layout: str) -> tuple[str, ...]:
    """Every region of ``layout``, in model output order: ``("wt", "tc", "et"[, "rc"])``."""
    return label_table(layout).region_names


def region_label_values(layout: str, names: Sequence[str] | None = None) -> dict[str, tuple[int, ...]]:
    """``{region: label values}`` of ``layout`` (all regions, or ``names``), e.g. for scoring."""
    regions = {r.name: r.labels for r in label_table(layout).regions}
    return {n: regions[n] for n in (names if names is not None else regions)}


def output_regions(layout: str, out_channels: int) -> tuple[str, ...]:
    """The regions a model with ``out_channels`` sigmoid outputs predicts for ``layout``.

    Args:
        layout: the dataset layout.
        out_channels: ``0`` = one output per region of the layout (the default); ``1`` = WT
            only; otherwise it must equal the layout's number of regions.

    Raises:
        ValueError: any other value, naming the layout's regions.
    """
    names = region_names(layout)
    if out_channels in (0, len(names)):
        return names
    if out_channels == 1:
        return names[:1]
    raise ValueError(
        f"model.out_channels={out_channels} does not fit data.layout={layout}, whose regions are "
        f"{', '.join(n.upper() for n in names)}: use model.out_channels=0 (one output per region, the default) "
        "or 1 (WT only)."
    )


def region_parents(layout: str, out_channels: int = 0) -> tuple[int, ...]:
    """For each output region, the index of the outermost other output region containing it, or -1.

    Derived from the label sets, not written per layout: TC's and ET's labels are strict
    subsets of WT's, so BraTS gives ``(-1, 0, 0)``; the resection cavity of brats2024 lies in
    no tumour region (``(-1, 0, 0, -1)``); a WT-only model has ``(-1,)``. A model with nested
    outputs predicts each sub-region within the tumour (``P(TC) = P(WT) * P(TC | WT)``,
    ``P(ET) = P(WT) * P(ET | WT)``); that ET lies in TC is left to the nesting rule of the
    written label map, as for independent outputs.
    """
    names = output_regions(layout, out_channels)
    sets = {r.name: set(r.labels) for r in label_table(layout).regions}
    parents = []
    for name in names:
        holders = [j for j, other in enumerate(names) if sets[name] < sets[other]]
        parents.append(max(holders, key=lambda j: len(sets[names[j]]), default=-1))
    return tuple(parents)


def invalid_label_values(label: np.ndarray, layout: str) -> list:
    """Values present in ``label`` that are not in the layout's label set."""
    valid = label_table(layout).values
    return [v for v in np.unique(label).tolist() if v not in valid]


def _hint_for(present: set[int], bad: list, layout: str, hint: str) -> str:
    """ "Use data=<other>" when every value present is another layout's (e.g. brats2024's RC 4)."""
    fits = sorted(
        (o for o, t in LABELS.items() if o != layout and present <= set(t.values)), key=lambda o: len(LABELS[o].values)
    )
    if not fits:
        return hint
    names = ", ".join(f"{int(v)} = {LABELS[fits[0]].names[int(v)]}" for v in bad)
    return f"The file's labels are those of data={' or data='.join(fits)} ({names} there): use that layout."


def check_label_map(case_id: str, path, data: np.ndarray, layout: str, hint: str) -> np.ndarray:
    """``data`` as an integer label map, or a CaseError naming the file and the bad values.

    Args:
        case_id, path: for the message.
        data: the label (or mask) file's voxels.
        layout: whose label set applies.
        hint: what the user should do about bad values (replaced by "use data=<other>"
            when the bad values are exactly the extra labels of another layout, such as
            the resection cavity 4 of brats2024 in a brats2023 dataset).
    """
    from brats_seg.data.errors import CaseError

    labels = np.rint(data)
    if not np.array_equal(labels, data):
        raise CaseError(case_id, path, "label map holds non-integer values", "Write it as an integer label map.")
    bad = invalid_label_values(labels, layout)
    if bad:
        raise CaseError(
            case_id,
            path,
            f"label values {[int(v) for v in bad]} are not in the {layout} label set "
            f"{list(label_table(layout).values)}",
            _hint_for(set(np.unique(labels).astype(int).tolist()), bad, layout, hint),
        )
    return labels.astype(np.int16)


def labels_to_regions(label: np.ndarray, layout: str, names: Sequence[str] | None = None) -> np.ndarray:
    """Map a label map to its binary regions.

    Args:
        label: integer label map, shape ``(x, y, z)``.
        layout: a key of :data:`LABELS`.
        names: the regions to return, in this order; default every region of the layout.

    Returns:
        uint8 array ``(x, y, z, R)`` in {0, 1}.
    """
    label = np.asarray(label)
    regions = region_label_values(layout, names)
    return np.stack([np.isin(label, values) for values in regions.values()], axis=-1).astype(np.uint8)


def regions_to_labels(regions: np.ndarray, layout: str, names: Sequence[str] | None = None) -> np.ndarray:
    """Inverse of :func:`labels_to_regions`, in the layout's own label values.

    Regions need not be nested (a thresholded prediction may have ET outside WT): each
    region is painted with its label in the table's ``paint_order``, later regions
    winning, so ET > TC > WT as in the BraTS convention, and tumour over cavity. A
    region not among ``names`` is not painted (a WT-only model's mask holds only the
    edema label: reading it back gives exactly the predicted WT and empty TC/ET).

    Args:
        regions: array ``(x, y, z, R)``, bool or {0, 1}.
        layout: a key of :data:`LABELS`.
        names: the region of each channel; default every region of the layout.

    Returns:
        uint8 label map ``(x, y, z)``.
    """
    table = label_table(layout)
    names = tuple(names) if names is not None else table.region_names
    regions = np.asarray(regions)
    if regions.ndim != 4 or regions.shape[-1] != len(names):
        raise ValueError(f"regions should have shape (x, y, z, {len(names)}) for regions {names}, got {regions.shape}.")
    unknown = sorted(set(names) - set(table.region_names))
    if unknown:
        raise ValueError(f"regions {unknown} are not regions of {layout} ({', '.join(table.region_names)}).")
    label = np.zeros(regions.shape[:3], dtype=np.uint8)
    for region, value in table.paint_order:
        if region in names:
            label[regions[..., names.index(region)].astype(bool)] = value
    return label


def resolve_model_outputs(cfg: TrainConfig) -> TrainConfig:
    """A copy of ``cfg`` with ``model.out_channels`` (and ``model.region_parents``) set from
    ``data.layout``; ``cfg`` itself is not written into.

    ``0`` (the default) becomes one output per region of the layout (3: WT, TC, ET; 4 with
    the resection cavity of brats2024); ``1`` (WT only) stays. Idempotent: a run folder's
    config.json holds the resolved value and resolves to itself. Called where a run is
    resolved (:func:`brats_seg.resolve.resolve_run`) and where a stored run is read.

    Raises:
        ValueError: a value that fits neither, naming the layout's regions.
    """
    check_choice(
        cfg.model.regions,
        Regions,
        "model.regions",
        hint="nested (the default) predicts TC and ET within WT; independent, free sigmoids.",
    )
    out_channels = len(output_regions(cfg.data.layout, cfg.model.out_channels))
    parents = region_parents(cfg.data.layout, out_channels)
    model = replace(
        cfg.model,
        out_channels=out_channels,
        region_parents=list(parents) if cfg.model.regions == "nested" else [-1] * len(parents),
    )
    return replace(cfg, model=model)

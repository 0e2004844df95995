"""Foundation-model corpora: series stored one per row in list columns, served as packed sequences
(``CorpusDataset``; ``dw.mix`` of several: one corpus with exact quotas). See ``docs/corpora.md``."""

from dask_windows.corpus.dataset import CorpusDataset, CorpusSettings, LeftOutSeriesWarning, mix_corpora
from dask_windows.corpus.items import LeftOut
from dask_windows.corpus.source import ListSource

__all__ = ["CorpusDataset", "CorpusSettings", "LeftOut", "LeftOutSeriesWarning", "ListSource", "mix_corpora"]

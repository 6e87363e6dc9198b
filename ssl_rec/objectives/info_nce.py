"""InfoNCE / NT-Xent between two views of each row."""

from __future__ import annotations

from ssl_rec._checks import check_at_least, check_positive
from ssl_rec.objectives.base import Objective
from ssl_rec.objectives.contrastive import ProjectionHead, nt_xent_output
from ssl_rec.types import BackboneProtocol, Batch, ObjectiveOutput
from ssl_rec.views import CorrelatedFieldMask, View


class InfoNCE(Objective):
    """Contrast two augmented views of each row against the other rows of the batch.

    Oord et al., "Representation Learning with Contrastive Predictive Coding", 2018,
    https://arxiv.org/abs/1807.03748 (InfoNCE); Chen et al., SimCLR, ICML 2020,
    https://arxiv.org/abs/2002.05709 (NT-Xent, projection head); two-tower feature-masking
    views from Yao et al., CIKM 2021, https://arxiv.org/abs/2007.12865. Logs the
    alignment and uniformity of the projections (Wang & Isola, ICML 2020).

    Args:
        view: augmentation drawn independently for each of the two views; ``None`` uses
            correlated feature masking of half the fields.
        projection_dim: output width of the projection head.
        temperature: softmax temperature (> 0).
        hidden: hidden width of the projection head.
        max_rows: contrast only the batch's first ``max_rows`` rows (rows arrive shuffled);
            the ``2B x 2B`` similarity matrix of a 4096-row batch alone is 256 MB.

    """

    def __init__(
        self,
        view: View | None = None,
        projection_dim: int = 64,
        temperature: float = 0.2,
        hidden: int = 128,
        max_rows: int = 1024,
    ) -> None:
        super().__init__()
        self.temperature = check_positive("InfoNCE", "temperature", temperature)
        sizes = {"projection_dim": projection_dim, "hidden": hidden, "max_rows": max_rows}
        for key, value in sizes.items():
            check_at_least("InfoNCE", key, value)
        self.view = view if view is not None else View(CorrelatedFieldMask(0.5))
        self.projection_dim, self.hidden = int(projection_dim), int(hidden)
        self.max_rows = int(max_rows)

    def setup(self, backbone: BackboneProtocol) -> None:
        """Build the projection head ``H -> projection_dim``."""
        self.projection = ProjectionHead(backbone.dims.output_dim, self.hidden, self.projection_dim)

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """NT-Xent of two views; logs alignment and uniformity."""
        batch = batch.head(self.max_rows)
        z1 = self.projection(self.view(batch, backbone).rep.pooled)
        z2 = self.projection(self.view(batch, backbone).rep.pooled)
        return nt_xent_output(z1, z2, self.temperature)

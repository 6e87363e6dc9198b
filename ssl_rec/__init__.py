"""ssl-rec: self-supervised representation learning for recommender systems.

Generative, contrastive and adversarial pretraining objectives on a low-precision cached
embedding backbone, fine-tuned on Criteo-style CTR tasks and evaluated with FAISS.
"""

from ssl_rec.types import Batch, ObjectiveOutput, Representation

__all__ = ["Batch", "ObjectiveOutput", "Representation"]
__version__ = "0.1.0"

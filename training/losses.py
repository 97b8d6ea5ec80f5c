"""Losses, each a small module or function on L2-normalised features.

Contrastive losses take an exponentiated logit scale, never the model
(as open_clip's ``loss.py`` does). Continual and XBT losses live here too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MAX_LOGIT_SCALE = 100.0


def clip_loss(image: torch.Tensor, text: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE (CLIP, Radford et al. 2021).

    image, text: [B, D] L2-normalised; scale: exp(logit_scale), clamped to <= 100.
    L = (CE(s S, y) + CE(s S^T, y)) / 2 with S = image @ text.T and y = arange(B).
    """
    scale = torch.as_tensor(scale, device=image.device).clamp(max=MAX_LOGIT_SCALE)
    logits = scale * image @ text.t()  # [B, B]
    labels = torch.arange(image.shape[0], device=image.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


class ClipLoss(nn.Module):
    """Module form of :func:`clip_loss` (plain contrastive training, SeqFT)."""

    def forward(self, image: torch.Tensor, text: torch.Tensor,
                scale: torch.Tensor | float) -> torch.Tensor:
        return clip_loss(image, text, scale)


# --------------------------------------------------------------------------- XBT
# Cross-modal backward-compatible training (Jang & Lim, "XBT", Sec. 3). Every term is the
# symmetric contrastive loss L_c with a FIXED logit scale exp(2.6592) (= 1/0.07); inputs are
# L2-normalised, and phi's outputs live in the OLD model's space.


def xbt_pretrain_loss(phi_noisy_text: torch.Tensor, old_text: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """XBT eq. 3, text-only pretraining: L_pre = L_c(phi(w_new + eps), w_old).

    phi_noisy_text: [B, D_old] normalised phi(w_new + eps); old_text: [B, D_old] w_old.
    """
    return clip_loss(phi_noisy_text, old_text, scale)


def xbt_loss(phi_image: torch.Tensor, phi_text: torch.Tensor, scale: float) -> torch.Tensor:
    """XBT eq. 5: L_x = L_c(phi(v_new), phi(w_new)); no old embedding is involved.

    phi_image, phi_text: [B, D_old] normalised projections of the new model's pair features.
    """
    return clip_loss(phi_image, phi_text, scale)


def xbt_anchor_loss(phi_text: torch.Tensor, old_text: torch.Tensor, scale: float) -> torch.Tensor:
    """Optional anchoring term (METHODS.md, XBT): L_c(phi(w_new), w_old) on old text embeddings
    cached in stage 1, so stage 2 keeps the text side in the old space without the old model.

    phi_text: [B, D_old] normalised; old_text: [B, D_old].
    """
    return clip_loss(phi_text, old_text, scale)


def xbt_direct_loss(phi_image: torch.Tensor, phi_text: torch.Tensor, old_image: torch.Tensor,
                    old_text: torch.Tensor, scale: float) -> torch.Tensor:
    """The Direct baseline (XBT Sec. 4.2): L_direct = L_c(phi(v_new), w_old) + L_c(phi(w_new), v_old).

    phi_image, phi_text: [B, D_old] normalised projections; old_image, old_text: [B, D_old]
    embeddings of the same pairs by the old model.
    """
    return clip_loss(phi_image, old_text, scale) + clip_loss(old_image, phi_text, scale)


# --------------------------------------------------------------------------- continual
# Continual phases (METHODS.md "Mod-X", "CTP", "CLL-CLIP with TEIR"). Features are
# L2-normalised [B, D] unless a docstring says otherwise; "old" features come from the
# frozen model of before the phase, computed under no_grad.


def _kept_row_kl(old: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
    """Sum over kept rows of KL(softmax(old_row) || softmax(cur_row)), temperature 1.

    A row is kept when the old model ranks its own pair first (argmax == i); the other
    rows contribute exactly zero, as the reference's row copy makes them.
    """
    keep = old.argmax(dim=1) == torch.arange(old.shape[0], device=old.device)  # [B]
    log_old, log_cur = old.log_softmax(dim=1), cur.log_softmax(dim=1)  # [B, B]
    kl = (log_old.exp() * (log_old - log_cur)).sum(dim=1)  # [B]
    return (kl * keep).sum()


def modx_distill_loss(image: torch.Tensor, text: torch.Tensor, old_image: torch.Tensor,
                      old_text: torch.Tensor) -> torch.Tensor:
    """Mod-X off-diagonal information distillation (Ni et al., "Continual Vision-Language
    Representation Learning with Off-Diagonal Information", ICML 2023, Sec. 4).

    L_kd = (KL(softmax(O_i2t) || softmax(M_i2t)) + KL(softmax(O_t2i) || softmax(M_t2i))) / 2
    on raw cosines (temperature 1), summed over every entry of the rows the old model
    retrieves correctly (row correction: i2t and t2i by their own argmax).
    """
    cur = image @ text.t()  # [B, B] M_i2t; its transpose is M_t2i
    old = old_image @ old_text.t()  # [B, B] O_i2t
    return (_kept_row_kl(old, cur) + _kept_row_kl(old.t(), cur.t())) / 2


def ctp_momentum_contrast_loss(image: torch.Tensor, text: torch.Tensor,
                               momentum_image: torch.Tensor, momentum_text: torch.Tensor,
                               queue_image: torch.Tensor, queue_text: torch.Tensor,
                               tau: float) -> torch.Tensor:
    """CTP compatible momentum contrast L_cmc (Zhu et al., "CTP: Towards Vision-Language
    Continual Pretraining via Compatible Momentum Contrast and Topology Preservation",
    ICCV 2023, eq. 4), without the masked-language term (no fusion encoder here).

    image, text: [B, D] current model; momentum_*: [B, D] momentum model, scored first;
    queue_*: [K, D] earlier momentum features (K may be 0). Hard one-hot targets on the
    batch's own momentum feature; tau fixed.
    """
    labels = torch.arange(image.shape[0], device=image.device)
    text_keys = torch.cat([momentum_text, queue_text])  # [B + K, D]
    image_keys = torch.cat([momentum_image, queue_image])  # [B + K, D]
    i2t = F.cross_entropy(image @ text_keys.t() / tau, labels)
    t2i = F.cross_entropy(text @ image_keys.t() / tau, labels)
    return (i2t + t2i) / 2


def _batchmean_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) || softmax(student)) row-wise, summed and divided by B."""
    return F.kl_div(student_logits.log_softmax(dim=1), teacher_logits.log_softmax(dim=1),
                    reduction="batchmean", log_target=True)


def ctp_cross_topology_loss(image: torch.Tensor, text: torch.Tensor, old_image: torch.Tensor,
                            old_text: torch.Tensor, tau: float) -> torch.Tensor:
    """CTP cross-modal topology preservation L_c (Zhu et al. 2023, eq. 6-7).

    P^i2t = softmax(v w^T / tau) row-wise (and P^t2i on the transpose), old model as the
    teacher; KL "batchmean"; the diagonal is not masked.
    """
    cur = image @ text.t() / tau  # [B, B]
    old = old_image @ old_text.t() / tau  # [B, B]
    return (_batchmean_kl(old, cur) + _batchmean_kl(old.t(), cur.t())) / 2


def _self_similarity(features: torch.Tensor, diagonal: float, tau: float) -> torch.Tensor:
    sim = features @ features.t()  # [B, B]
    eye = torch.eye(sim.shape[0], dtype=torch.bool, device=sim.device)
    return sim.masked_fill(eye, diagonal) / tau  # diagonal replaced BEFORE the temperature


def ctp_same_topology_loss(image: torch.Tensor, text: torch.Tensor, old_image: torch.Tensor,
                           old_text: torch.Tensor, tau: float,
                           diagonal: float = -1000.0) -> torch.Tensor:
    """CTP same-modal topology preservation L_s (Zhu et al. 2023, eq. 8-9): the L_c rule on
    v v^T and w w^T, each row's self-similarity set to ``diagonal`` in teacher and student."""
    images = _batchmean_kl(_self_similarity(old_image, diagonal, tau),
                           _self_similarity(image, diagonal, tau))
    texts = _batchmean_kl(_self_similarity(old_text, diagonal, tau),
                          _self_similarity(text, diagonal, tau))
    return (images + texts) / 2


def multi_positive_infonce(text: torch.Tensor, image: torch.Tensor, owners: torch.Tensor,
                           temperature: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE where every caption of the same image is a positive (CLL-CLIP's
    cross-modal term, Yang et al., "Embracing Language Inclusivity and Diversity in CLIP
    through Continual Language Learning", AAAI 2024, eq. 3).

    text: [B, D] normalised student captions; image: [B, D] normalised teacher embeddings of
    each caption's image; owners: [B] image id of each caption. Targets spread evenly over
    the positives of a row.
    """
    positives = (owners[:, None] == owners[None, :]).float()  # [B, B], symmetric
    targets = positives / positives.sum(dim=1, keepdim=True)
    logits = text @ image.t() / temperature  # [B, B]
    t2i = -(targets * logits.log_softmax(dim=1)).sum(dim=1).mean()
    i2t = -(targets * logits.t().log_softmax(dim=1)).sum(dim=1).mean()
    return (t2i + i2t) / 2

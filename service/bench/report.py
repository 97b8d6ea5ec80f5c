"""Human-readable table of a ``bench serve`` result."""

from __future__ import annotations

from typing import Any


def render(result: dict[str, Any]) -> str:
    setup = result["setup"]
    lines = [f"model: {result['model']}  device: {result['device']}",
             f"gallery: {setup['gallery_points']} points, {setup['embedded_by_encoder']} embedded "
             f"by the encoder" + (f", the rest replicated from them with N(0, "
                                  f"{setup['noise_std']}) noise" if setup["replicated_with_noise"]
                                  else "")]
    for modality in ("text", "image"):
        bare = result["bare"][modality]
        lines.append(f"\n{modality}: bare encoder + search p50 {bare['p50_ms']:.1f} ms "
                     f"(encode {bare['encode_p50_ms']:.1f}, search {bare['search_p50_ms']:.1f})")
        lines.append("mode        clients      QPS   p50 ms   p99 ms  errors")
        for mode in ("batched", "unbatched"):
            for level, cell in result[mode][modality].items():
                lines.append(f"{mode:10}  {level:>7}  {cell['qps']:7.2f}  {cell['p50_ms']:7.1f}  "
                             f"{cell['p99_ms']:7.1f}  {cell['errors']:6d}")
    lines.append("")
    lines += [f"target {name}: {'met' if check['met'] else 'MISSED'} ({check['value']})"
              for name, check in result["targets"].items()]
    return "\n".join(lines)

"""Rewrite a `docker save` archive so kind sees every image in it.

`kind build node-image` decides which images it must pull by reading the tags
of its four image archives (kube-apiserver.tar and the rest) with
GetArchiveTags, which parses the first `manifest.json` or `repositories` entry
it meets and, from manifest.json, only the first image's RepoTags. Docker
writes manifest.json before repositories, so in an archive of several images
kind would see one and try to pull the others. This writes a `repositories`
entry first, listing every image's tags under the fully qualified names kind
compares with (docker.io/kindest/..., not Docker's short kindest/...), then the
rest of the archive unchanged; containerd's import reads manifest.json as before.

    python3 kind_archive.py IN.tar OUT.tar
"""

from __future__ import annotations

import io
import json
import sys
import tarfile


def qualify(repo: str) -> str:
    """Docker's short name -> the full reference kind and containerd use."""
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return repo
    return "docker.io/" + (repo if rest else "library/" + repo)


def repositories(manifest: list[dict]) -> dict[str, dict[str, str]]:
    repos: dict[str, dict[str, str]] = {}
    for entry in manifest:
        image_id = entry["Config"].removesuffix(".json").split("/")[-1]
        for ref in entry.get("RepoTags") or []:
            repo, _, tag = ref.rpartition(":")
            repos.setdefault(qualify(repo), {})[tag] = image_id
    return repos


def rewrite(src: str, dst: str) -> list[str]:
    with tarfile.open(src) as tin:
        manifest = json.load(tin.extractfile("manifest.json"))
        repos = repositories(manifest)
        data = json.dumps(repos, sort_keys=True).encode()
        with tarfile.open(dst, "w") as tout:
            info = tarfile.TarInfo("repositories")
            info.size, info.mode = len(data), 0o644
            tout.addfile(info, io.BytesIO(data))
            for member in tin:
                if member.name == "repositories":
                    continue
                tout.addfile(member, tin.extractfile(member) if member.isfile() else None)
    return sorted(f"{repo}:{tag}" for repo, tags in repos.items() for tag in tags)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    for ref in rewrite(sys.argv[1], sys.argv[2]):
        print(ref)

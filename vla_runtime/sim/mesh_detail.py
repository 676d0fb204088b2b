"""Fewer triangles for rendering: quadric decimation of a compiled model's meshes, in place.

The FR3's visual meshes have 240k triangles. Mesa's CPU rasteriser spends its time on
vertices, not pixels, at the policy's image sizes (96 px: 28 ms per scene frame, 17 ms per
wrist frame); at 3000 triangles per mesh a frame takes a third of that, and the images differ
by about one grey level on average. Only a renderer's private copy of the model is changed:
vertices stay in the mesh's own frame, so geom poses and the physics are untouched.
"""

from __future__ import annotations

import fast_simplification
import mujoco
import numpy as np

RENDER_MESH_FACES = 3000  # per mesh; 0 = full detail
CREASE_COS = 0.8  # neighbouring triangles at larger angles keep their own normals
WELD_TOLERANCE_M = 1e-4  # closer vertices are one (seams of the shipped meshes are open by ~10 um)


def simplify_meshes(model: mujoco.MjModel, max_faces: int = RENDER_MESH_FACES) -> int:
    """Decimate every untextured mesh above `max_faces` triangles; returns the triangles left."""
    if max_faces <= 0:
        return int(model.mesh_facenum.sum())
    for mesh in range(model.nmesh):
        n_faces = int(model.mesh_facenum[mesh])
        if n_faces <= max_faces or model.mesh_texcoordnum[mesh]:
            continue
        v0, nv = model.mesh_vertadr[mesh], model.mesh_vertnum[mesh]
        f0 = model.mesh_faceadr[mesh]
        vertices, faces = _weld(model.mesh_vert[v0 : v0 + nv], model.mesh_face[f0 : f0 + n_faces])
        if len(faces) <= max_faces:
            continue
        vertices, faces = fast_simplification.simplify(
            vertices, faces, target_reduction=1.0 - max_faces / len(faces)
        )
        # The simplified mesh fits in the original's slots; the renderer reads the counts.
        nv, nf = len(vertices), len(faces)
        normals, corner_normal = _distinct(_corner_normals(vertices, faces), 1e-6)
        if len(normals) > model.mesh_normalnum[mesh]:
            continue  # no room for its normals: keep the full mesh
        model.mesh_vert[v0 : v0 + nv] = vertices
        model.mesh_face[f0 : f0 + nf] = faces
        model.mesh_vertnum[mesh], model.mesh_facenum[mesh] = nv, nf
        n0 = model.mesh_normaladr[mesh]
        model.mesh_normal[n0 : n0 + len(normals)] = normals
        model.mesh_normalnum[mesh] = len(normals)
        model.mesh_facenormal[f0 : f0 + nf] = corner_normal.reshape(nf, 3)
    return int(model.mesh_facenum.sum())


def _weld(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge coincident vertices (compiled meshes split them per normal), drop degenerate
    triangles: decimation needs a connected surface."""
    points, index = _distinct(vertices.astype(np.float64), WELD_TOLERANCE_M)
    faces = index[faces]
    a, b, c = faces.T
    return points, faces[(a != b) & (b != c) & (a != c)]


def _distinct(rows: np.ndarray, grid: float) -> tuple[np.ndarray, np.ndarray]:
    """One row per cell of a `grid`-spaced lattice, and the index of each row's one."""
    key = np.ascontiguousarray(np.round(rows / grid).astype(np.int64))
    keys = key.view(np.dtype((np.void, key.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return rows[first], inverse.ravel().astype(np.int32)


def _corner_normals(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """One normal per triangle corner: the area-weighted mean of the vertex's triangles that
    face within CREASE_COS of this one (as MuJoCo smooths), so edges stay sharp."""
    a, b, c = (vertices[faces[:, k]] for k in range(3))
    weighted = np.cross(b - a, c - a)
    unit = weighted / np.maximum(np.linalg.norm(weighted, axis=1, keepdims=True), 1e-18)
    corner_vertex = faces.ravel()
    corner_face = np.repeat(np.arange(len(faces)), 3)
    order = np.argsort(corner_vertex, kind="stable")
    vertex_sorted = corner_vertex[order]
    normals = weighted[corner_face].copy()  # each corner's own triangle
    # Pair every corner with the other corners of its vertex, `shift` places apart in the
    # vertex-sorted order (a vertex rarely has more than a few dozen triangles).
    for shift in range(1, int(np.bincount(corner_vertex).max())):
        i, j = order[:-shift], order[shift:]
        same = vertex_sorted[:-shift] == vertex_sorted[shift:]
        i, j = i[same], j[same]
        fi, fj = corner_face[i], corner_face[j]
        smooth = np.einsum("ij,ij->i", unit[fi], unit[fj]) > CREASE_COS
        np.add.at(normals, i[smooth], weighted[fj[smooth]])
        np.add.at(normals, j[smooth], weighted[fi[smooth]])
    return normals / np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-18)

"""rewrite_outputs.py RECIPES.tsv OUT [rewrite options]: `dp2ddp rewrite` of every row's script (its workdir
copied from $REALRUN_REPOS, default /work/realrun-repos), outputs and printed lines saved in OUT:
compare two commits with `diff -r`."""
import csv, os, shutil, subprocess, sys
tsv, out = sys.argv[1], sys.argv[2]
extra = sys.argv[3:]
rows = [r for r in csv.reader(open(tsv), delimiter="\t") if r and r[0] != "name" and not r[0].startswith("#")]
for r in rows:
    name, repo, commit, script, wdir = r[:5]
    src = os.path.join(os.environ.get("REALRUN_REPOS", "/work/realrun-repos"), repo.replace("/", "+"))
    dst = os.path.join(out, name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True)
    wd = os.path.join(dst, wdir)
    p = subprocess.run([sys.executable, "-m", "dp2ddp", "rewrite", script, "-o", "OUT_ddp.py", *extra], cwd=wd, capture_output=True, text=True)
    open(os.path.join(out, name + ".log"), "w").write(f"rc={p.returncode}\n" + p.stdout + p.stderr)
    o = os.path.join(wd, "OUT_ddp.py")
    shutil.copy(o, os.path.join(out, name + ".out.py")) if os.path.exists(o) else None
    shutil.rmtree(dst)
    print(name, p.returncode, flush=True)

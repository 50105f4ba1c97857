# The three commands a new user needs (README.md), and the test targets CI runs.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/build/collections
MOLECULE := molecule --base-config extensions/molecule/config.yml

.PHONY: venv engine images lab deploy lab-down test lint sanity unit integration contract molecule faults clean

venv:
	bash scripts/bootstrap.sh

engine:
	bash scripts/ensure-docker.sh

## The main job on the embedded default: venv, Docker engine, lab images and nodes, deploy.
lab: venv engine
	ansible-playbook -i inventories/lab playbooks/lab.yml
	$(MAKE) --no-print-directory deploy

deploy:
	ansible-playbook -i inventories/lab deploy-qwen35.yml

## Take the lab down and remove everything it created (LAB_REMOVE_IMAGES=true removes images too;
## LAB_INVENTORY=inventories/lab3 takes the three-node lab down).
LAB_INVENTORY ?= inventories/lab
lab-down: venv
	ansible-playbook -i $(LAB_INVENTORY) playbooks/lab.yml -e lab_state=absent \
	  -e lab_remove_images=$${LAB_REMOVE_IMAGES:-false}

## Every test: lint, sanity, unit tests, Molecule scenarios on the lab, then the faults and bad inputs on the
## lab Molecule leaves up (one lab set-up for all of them); the bad-input suite takes it down.
# The lab images build beside lint, sanity and unit, which need none of them (its lines prefixed [images]).
# integration runs after them: it compares the engine's dgx-spark-lab images before and after each case.
# With -k the later suites run whatever the first ones gave, as before; without it the first failure stops.
# MOLECULE_DESTROY=never: make test runs the faults on the lab Molecule leaves up.
SUBMAKE := $(MAKE) --no-print-directory -o venv -o engine
KEEP_GOING = $(findstring k,$(firstword -$(MAKEFLAGS)))
test: venv engine
	@echo "test: the lab images (lines prefixed [images]) beside lint sanity unit"; \
	( $(SUBMAKE) images 2>&1 | sed -u 's/^/[images] /'; exit $${PIPESTATUS[0]} ) & images=$$!; \
	$(SUBMAKE) lint sanity unit; rc=$$?; \
	wait $$images || { echo "images FAILED: read its lines, prefixed [images]"; exit 1; }; \
	[ $$rc = 0 ] || [ -n "$(KEEP_GOING)" ] || exit $$rc; \
	$(SUBMAKE) -o images MOLECULE_DESTROY=never integration contract molecule faults || rc=1; exit $$rc

lint: venv
	ruff check .
	ruff format --check .
	ansible-lint --profile production --offline
	antsibull-changelog lint

sanity: venv
	bash scripts/sanity.sh

unit: venv
	pytest tests/unit

## The lab images only (content-tagged: an unchanged image is found, not rebuilt; LAB_REMOVE_STALE_IMAGES=true
## then removes the lab images of other inputs, as .ci/run does).
images: venv engine
	ansible-playbook -i inventories/lab playbooks/lab.yml -e lab_images_only=true \
	  -e lab_remove_stale_images=$${LAB_REMOVE_STALE_IMAGES:-false}

## What the collection emits of vLLM and Ray, held against the real packages in the lab's engine image.
# Two pytest workers: each test is a container of the engine image, and the Ray tests wait on Ray's own start
# (254 s in one process, 133 s in two, on the 2-core machine).
contract: images
	pytest -p no:cacheprovider -n 2 tests/contract

## Tests that drive the playbooks against the real Docker engine (no lab needed).
integration: venv engine
	pytest tests/integration

# Stage order: each scenario finds the lab as the stages before it left it (the default
# scenario creates the lab first and destroys it last).
SCENARIOS := preflight gpu fabric runtime_image ray_cluster vllm_server deploy reconverge mp
# Molecule's state lives in build/ and starts empty: state left in ~/.ansible/tmp by another checkout
# named the same (or an interrupted run) would otherwise make it skip creating the lab.
MOLECULE_STATE := $(CURDIR)/build/molecule-state
# never: leave the lab up at the end (make test runs the faults on it).
MOLECULE_DESTROY ?= always
# The scenarios start from nodes made new: a lab left up (make lab, a make test that failed and kept it, or
# one cut off mid-run, whose nested engines may hold half-loaded or half-removed images) is taken down first,
# the three-node one too.
# three_nodes runs on a lab of its own (inventories/lab3), made and taken down by it alone, beside the
# scenarios on the two-node lab: the machine is 2 cores, but image loads and copies, Ansible and the engines'
# starts leave it idle a fifth of the time, and the two labs share nothing but the images, built first.
# Its lines are prefixed with [three_nodes]; each Molecule run has its own state directory.
molecule: images
	rm -rf $(MOLECULE_STATE) $(MOLECULE_STATE)-three_nodes
	$(SUBMAKE) lab-down LAB_INVENTORY=inventories/lab
	@echo "molecule: three_nodes (its lines prefixed [three_nodes]) beside $(SCENARIOS)"; \
	( { $(SUBMAKE) lab-down LAB_INVENTORY=inventories/lab3 && \
	    MOLECULE_EPHEMERAL_DIRECTORY=$(MOLECULE_STATE)-three_nodes $(MOLECULE) test -s three_nodes; } 2>&1 \
	  | sed -u 's/^/[three_nodes] /'; exit $${PIPESTATUS[0]} ) & three=$$!; \
	MOLECULE_EPHEMERAL_DIRECTORY=$(MOLECULE_STATE) $(MOLECULE) test --destroy $(MOLECULE_DESTROY) \
	  $(foreach s,$(SCENARIOS),-s $(s)); rc=$$?; \
	wait $$three || { echo "molecule three_nodes FAILED: read its lines, prefixed [three_nodes]"; rc=1; }; exit $$rc

## Faults and bad inputs on the lab (inventories/lab; created when absent; the one `make lab` makes): each case
## one line, then `N passed, N failed`. The fault suite leaves the lab deployed for the bad-input suite, which
## takes it down.
faults: venv engine
	python tests/faults/run.py --keep-lab; rc=$$?; python tests/bad_inputs/run.py || rc=1; exit $$rc

clean:
	rm -rf build tests/output

# Two commands on a fresh machine (Python 3.10+):
#   make demo   set up .venv, prepare the bundled demo corpus, train briefly, write a model and a WAV
#   make test   set up .venv and run the test suite (CPU, offline)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_DIR := demo/work

.PHONY: demo test setup clean-demo

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10+ is needed; set PYTHON=python3.x")'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/python -m pip install -r requirements.txt
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/python prepare_data.py --input_dir demo/corpus --data_dir $(DEMO_DIR)/data --model_name scratch:tiny
	@echo
	@echo "Demo corpus prepared in $(DEMO_DIR)/data. Training (train_vits.py) is not built yet: the demo stops here."

test: setup
	$(BIN)/python -m pytest -q

clean-demo:
	rm -rf $(DEMO_DIR)

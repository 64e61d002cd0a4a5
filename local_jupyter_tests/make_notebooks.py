"""Writes the notebooks in this folder: python local_jupyter_tests/make_notebooks.py (from the repository root)."""
import nbformat as nbf


def nb(cells):
    book = nbf.v4.new_notebook()
    book.cells = [nbf.v4.new_markdown_cell(c[1]) if c[0] == "md" else nbf.v4.new_code_cell(c[1]) for c in cells]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return book

trace = nb([
    ("md", "# Tracing a model and reading its log\nTrace AlexNet (random weights), print the summary, look up layers in every key form."),
    ("code", "import torch, torchvision\nimport torchlens as tl\n\nalexnet = torchvision.models.alexnet(weights=None)\nx = torch.rand(1, 3, 224, 224)\nhistory = tl.log_forward_pass(alexnet, x, random_seed=0)\nprint(history)"),
    ("code", "entry = history['conv2d_3_7']\nprint(entry)\nassert history['features.6'] is entry and history[7] is entry and history[-17] is entry\nassert history['conv2d_3'] is entry and history['conv2d_3_7:1'] is entry"),
    ("code", "with torch.no_grad():\n    expected = alexnet.features[:7](x)\nassert torch.allclose(entry.activation, expected, atol=1e-5)\nentry.activation.shape"),
    ("code", "print(history['conv2d_3_7'].func_call_stack[0])"),
    ("code", "frame = history.to_pandas()\nframe[['label', 'layer_type', 'shape', 'num_params', 'containing_module']].head(8)"),
    ("md", "Save only some layers: labels, a module address, a position and a substring."),
    ("code", "subset = tl.log_forward_pass(alexnet, x, layers_to_save=['conv2d_3_7', 'features', -5, 'linear'])\nassert subset.layer_labels == ['conv2d_3_7', 'maxpool2d_3_13', 'linear_1_17', 'dropout_2_19', 'linear_2_20', 'linear_3_22']\nsubset.layer_labels"),
])

recurrent = nb([
    ("md", "# A recurrent model: passes, rolled view, inline drawings"),
    ("code", "import torch\nfrom torch import nn\nimport torchlens as tl\n\nclass SimpleRecurrent(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(in_features=5, out_features=5)\n\n    def forward(self, x):\n        for r in range(4):\n            x = self.fc(x)\n            x = x + 1\n            x = x * 2\n        return x\n\nmodel = SimpleRecurrent()\nhistory = tl.log_forward_pass(model, torch.rand(6, 5))\nprint(history)"),
    ("code", "print(history['linear_1_1:2'])\nassert history['fc:2'] is history['linear_1_1:2']\nhistory.rolled_layers['linear_1_1'].parents_per_pass"),
    ("md", "The history draws itself inline, and `show_model_graph` does too."),
    ("code", "history"),
    ("code", "tl.show_model_graph(model, torch.rand(6, 5), vis_mode='rolled')"),
])

validate = nb([
    ("md", "# Validation and gradients"),
    ("code", "import torch, torchvision\nimport torchlens as tl\n\nresnet = torchvision.models.resnet18(weights=None)\nx = torch.rand(1, 3, 64, 64)\nassert tl.validate_model_activations(resnet, x, random_seed=0, verbose=True)"),
    ("code", "history = tl.log_forward_pass(resnet, x, save_gradients=True)\nhistory[history.output_layers[0]].activation.sum().backward()\nconv = history['conv2d_1_1']\nprint(conv)\nassert conv.gradient is not None and conv.gradient.shape == conv.shape"),
    ("code", "frame = history.to_pandas()\nassert frame['has_gradient'].sum() > len(frame) // 2\nframe[['label', 'shape', 'grad_shape']].head()"),
])

inline = nb([
    ("md", "# Both pages inline\nThe interactive graph of a history, the card of one entry and the explorer of a watched run, inside the notebook: no server, no network."),
    ("code", "import torch, torchvision\nimport torchlens as tl\n\nresnet = torchvision.models.resnet18(weights=None)\nhistory = tl.log_forward_pass(resnet, torch.rand(1, 3, 64, 64), random_seed=0)\nhistory"),
    ("code", "history['layer1.0.conv1']"),
    ("code", "history.show(height=420);"),
    ("md", "A watched training run: its explorer so far."),
    ("code", "import tempfile\n\nmodel = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nw = tl.watch(model, run_dir=tempfile.mkdtemp(), backend=None, verbose=False)\nfor step in range(4):\n    optimizer.zero_grad()\n    model(torch.randn(16, 4)).pow(2).mean().backward()\n    optimizer.step()\nw.close()\nw"),
])

for name, book in [("01_trace_and_index", trace), ("02_recurrent_and_drawing", recurrent), ("03_validate_and_gradients", validate), ("04_inline_pages", inline)]:
    nbf.write(book, f"local_jupyter_tests/{name}.ipynb")
